package rss

import (
	"testing"

	"github.com/ustack/ustack/internal/testutil"
)

// TestMain fails the package's tests if they leave a goroutine running or
// a page of a testutil pool out.
func TestMain(m *testing.M) { testutil.Main(m) }
