package bench

// The TAP floor's row names.
const (
	FloorReflectorName     = "TAP floor: stateless reflector"
	FloorReflectorBusyName = "TAP floor: stateless reflector, busy"
	FloorSinkName          = "TAP floor: sink"
)

// FloorSinkRow is the bulk bench's TAP floor row at mtu: the stateless
// sink on the bench's TAP (MeasureFloorSink), the most a receiver on that
// TAP can take from the sender.
func FloorSinkRow(mtu int) Row {
	return Row{Name: FloorSinkName, Floor: true, MTU: mtu}
}
