package stack_test

import (
	"io"
	"testing"
	"time"

	"github.com/ustack/ustack/internal/testutil"
	"github.com/ustack/ustack/stack/stacktest"
)

// TestDelayedACKAfterFIN: a server answers ("hello", so its flow is in
// pingpong mode), closes its side (FIN_WAIT1, then FIN_WAIT2), and the
// client sends its last bytes and its FIN. Nothing the server sends after
// its FIN can carry an ACK, so no ACK is held any more: Linux's tcp_fin
// acknowledges a FIN in FIN_WAIT2 at once (tcp_send_ack). Held (for the
// hour of this test), the client would sit in LAST_ACK until its FIN's
// retransmission drew a second ACK; this test sees the hold itself in
// tcp_delack_held.
func TestDelayedACKAfterFIN(t *testing.T) {
	rx, peer, client, server := delackPair(t, time.Hour)
	if _, err := server.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := server.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(client)
	if err != nil || string(got) != "hello" {
		t.Fatalf("client read %q, %v; want hello and the server's FIN", got, err)
	}
	held0 := counter(rx, "tcp_delack_held")
	if _, err := client.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err = io.ReadAll(server); err != nil || string(got) != "bye" {
		t.Fatalf("server read %q, %v; want bye and the client's FIN", got, err)
	}
	// The client's connection ends when its FIN is acknowledged.
	testutil.WaitFor(t, "the client's connection closed (its FIN acknowledged)", func() bool {
		return stacktest.Counters(peer.EachGVisorCounter)["gvisor_tcp_current_connected"] == 0
	})
	if held := counter(rx, "tcp_delack_held") - held0; held != 0 {
		t.Errorf("tcp_delack_held: %d ACKs held after the server's FIN, want 0", held)
	}
}
