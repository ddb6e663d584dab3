package testbed_test

import (
	"testing"

	"github.com/ustack/ustack/internal/testutil"
)

// TestMain fails the package's tests if they leave a goroutine running, a
// page of a testutil pool out or a namespace open. It is in the external
// test package: testutil imports testbed.
func TestMain(m *testing.M) { testutil.Main(m) }
