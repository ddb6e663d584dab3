package bench

import (
	"reflect"
	"testing"

	"github.com/ustack/ustack/stack"
	"github.com/ustack/ustack/stack/serve"
)

type fakePolicy struct{ views bool }

func (fakePolicy) StackConfig() (stack.Config, error) { return stack.Config{}, nil }
func (p fakePolicy) ReadViews() bool                  { return p.views }
func (p fakePolicy) PlainWire() bool                  { return false }

// TestDiscard checks the reader of each kind of row, the stock endpoint's
// (no Policy) included.
func TestDiscard(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
		want any
	}{
		{"stock", nil, serve.Discard},
		{"read", fakePolicy{}, serve.Discard},
		{"views", fakePolicy{views: true}, serve.DiscardViews},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := reflect.ValueOf(discard(tc.p)).Pointer(), reflect.ValueOf(tc.want).Pointer(); got != want {
				t.Errorf("discard: got %#x, want %#x", got, want)
			}
			if got, want := readViews(tc.p), tc.name == "views"; got != want {
				t.Errorf("readViews: got %v, want %v", got, want)
			}
		})
	}
}
