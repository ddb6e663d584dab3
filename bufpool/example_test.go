package bufpool_test

import (
	"fmt"

	"github.com/ustack/ustack/bufpool"
)

// The NIC model's side of the pool (seed 001): a page retired while a
// packet still reads it waits in the quarantine ring, Get allocates rather
// than wait for it, and the page is handed out again once the packet let
// go.
func Example() {
	pool, err := bufpool.New(bufpool.Config{RingSize: 8})
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	pg, _ := pool.Get()
	n := copy(pg.Bytes(), "a frame")
	pg.IncRef() // a packet's frag of the page
	frag := bufpool.Frag{Page: pg, Len: uint32(n)}
	pool.Recycle(pg) // the NIC model retires the page

	next, _ := pool.Get() // the oldest ring page is still read: a new one
	fmt.Println("same page while the packet holds it:", next == pg)
	fmt.Printf("the packet reads %q\n", frag.Bytes())
	frag.Page.DecRef() // the packet is done
	pool.Recycle(next)

	again, _ := pool.Get()
	fmt.Println("same page once it is released:", again == pg)
	pool.Recycle(again)
	st := pool.Stats()
	fmt.Println("rx_pp_alloc_fast", st.AllocFast, "rx_pp_alloc_slow", st.AllocSlow, "rx_pp_alloc_refill", st.AllocRefill)
	// Output:
	// same page while the packet holds it: false
	// the packet reads "a frame"
	// same page once it is released: true
	// rx_pp_alloc_fast 1 rx_pp_alloc_slow 2 rx_pp_alloc_refill 1
}
