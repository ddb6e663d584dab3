package main

import (
	"errors"
	"reflect"
	"testing"

	"github.com/ustack/ustack/stack"
)

// TestRunConfig: `ustack run` starts from stack.ServiceConfig (-config
// service, the default) or from Config's zero value (-config mlx5), and a
// switch on the command line wins over either.
func TestRunConfig(t *testing.T) {
	base := []string{"-tap", "mem0", "-addr", "10.0.0.2/24"}
	parse := func(args ...string) stack.Config {
		t.Helper()
		o, err := parseRun(append(append([]string(nil), base...), args...))
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return o.cfg
	}
	svc := stack.ServiceConfig()
	if len(serviceSettings()) == 0 {
		t.Fatal("stack.ServiceConfig changes nothing: want its settings")
	}
	// The settings are ServiceConfig's receive-path fields, no more.
	for _, args := range [][]string{nil, {"-config", "service"}} {
		got := parse(args...)
		if got.Driver.CoalesceBytes != svc.Driver.CoalesceBytes || got.Pool.Order != svc.Pool.Order ||
			got.ZeroCopy != svc.ZeroCopy || got.DelayedACK != svc.DelayedACK || got.Driver.BusyPoll != svc.Driver.BusyPoll {
			t.Errorf("%v: got %+v, want stack.ServiceConfig's policies %+v", args, got.Driver, svc.Driver)
		}
	}
	mlx5 := parse("-config", "mlx5")
	def := defaultPolicy()
	if !reflect.DeepEqual(mlx5.Driver, def.cfg.Driver) || mlx5.DelayedACK != 0 || mlx5.Pool.Order != def.cfg.Pool.Order {
		t.Errorf("-config mlx5: got %+v, want the switches' defaults %+v", mlx5.Driver, def.cfg.Driver)
	}
	// A switch given wins over the configuration, in either order.
	for _, args := range [][]string{{"-coalesce-bytes", "0"}, {"-coalesce-bytes", "0", "-config", "service"}} {
		if got := parse(args...); got.Driver.CoalesceBytes != 0 {
			t.Errorf("%v: coalesce bytes %d, want 0", args, got.Driver.CoalesceBytes)
		}
	}
	if _, err := parseRun(append(append([]string(nil), base...), "-config", "fast")); err == nil || !errors.As(err, new(usageError)) {
		t.Errorf("-config fast: got %v, want a usage error", err)
	}
}

// TestServiceRows: the bench's first row, and -rr's, is the service
// configuration, with mlx5's beside it.
func TestServiceRows(t *testing.T) {
	rows := defaultRows(1500)
	cfg, err := rows[0].Policy.StackConfig()
	if err != nil {
		t.Fatal(err)
	}
	if svc := stack.ServiceConfig(); cfg.Driver.CoalesceBytes != svc.Driver.CoalesceBytes || cfg.Pool.Order != svc.Pool.Order || cfg.DelayedACK != svc.DelayedACK {
		t.Errorf("first row %q: got %+v, want stack.ServiceConfig's", rows[0].Name, cfg.Driver)
	}
	mlx5, err := rows[1].Policy.StackConfig()
	if err != nil {
		t.Fatal(err)
	}
	if def := defaultPolicy(); !reflect.DeepEqual(mlx5.Driver, def.cfg.Driver) {
		t.Errorf("second row %q: got %+v, want mlx5's defaults", rows[1].Name, mlx5.Driver)
	}
	rr := rrRows(1500)
	if rr[0].Name != "ustack service" || rr[1].Name != "ustack mlx5" {
		t.Errorf("rr rows %q, %q: want the service configuration, then mlx5", rr[0].Name, rr[1].Name)
	}
}
