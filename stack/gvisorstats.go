package stack

import (
	"reflect"
	"strings"
	"unicode"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// EachGVisorCounter calls fn for every counter of gVisor's tcpip.Stats,
// named by its path in snake case with a "gvisor_" prefix (for example
// gvisor_tcp_segments_dropped). It walks the structure by reflection: it is
// for diagnostics, not for a hot path.
func (s *Stack) EachGVisorCounter(fn func(name string, v uint64)) {
	st := s.ip.Stats()
	walkStats(reflect.ValueOf(&st).Elem(), "gvisor", fn)
}

var statCounterType = reflect.TypeOf((*tcpip.StatCounter)(nil))

func walkStats(v reflect.Value, prefix string, fn func(string, uint64)) {
	switch {
	case v.Type() == statCounterType:
		if !v.IsNil() {
			fn(prefix, v.Interface().(*tcpip.StatCounter).Value())
		}
		return
	case v.Kind() == reflect.Pointer:
		if !v.IsNil() {
			walkStats(v.Elem(), prefix, fn)
		}
		return
	case v.Kind() == reflect.Struct:
		if v.CanAddr() && v.Addr().Type() == statCounterType {
			fn(prefix, v.Addr().Interface().(*tcpip.StatCounter).Value())
			return
		}
		t := v.Type()
		for i := 0; i < v.NumField(); i++ {
			if !t.Field(i).IsExported() {
				continue
			}
			walkStats(v.Field(i), prefix+"_"+snake(t.Field(i).Name), fn)
		}
	}
}

func snake(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		if unicode.IsUpper(c) {
			if i > 0 && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}
