package bench

// SendResult is what `ustack send`, the bench's kernel sender, prints as
// JSON on its last line; the bench reads it back.
type SendResult struct {
	Bytes        int64   `json:"bytes"`
	Datagrams    int64   `json:"datagrams,omitempty"`
	Transactions int64   `json:"transactions,omitempty"`
	P50Us        float64 `json:"p50_us,omitempty"` // rr: median transaction latency
	P99Us        float64 `json:"p99_us,omitempty"` // rr: 99th percentile
	Seconds      float64 `json:"seconds"`
	Congestion   string  `json:"congestion,omitempty"`
}
