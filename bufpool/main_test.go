package bufpool_test

import (
	"testing"

	"github.com/ustack/ustack/internal/testutil"
)

// TestMain fails the package's tests if they leave a goroutine running.
// It sits in the external test package: testutil imports bufpool.
func TestMain(m *testing.M) { testutil.Main(m) }
