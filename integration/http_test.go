//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ustack/ustack/stack"
)

// TestHTTPOverTUNCurl serves HTTP from ustack on a TUN device (the service
// configuration, as a Go service would run it) to curl in the kernel's
// namespace, IPv4 and IPv6: an 8 MiB download and a 4 MiB upload, every
// byte checked by SHA-256; then ustack's own http.Client
// (Transport.DialContext = Stack.DialContext) fetches from a net/http
// server on a kernel socket in that namespace, by URL.
func TestHTTPOverTUNCurl(t *testing.T) {
	needRoot(t)
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl not installed")
	}
	const down, up = 8 << 20, 4 << 20
	blob := make([]byte, down)
	if _, err := io.ReadFull(randReader(701), blob); err != nil {
		t.Fatal(err)
	}
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	mux := http.NewServeMux()
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(blob)))
		w.Write(blob)
	})
	mux.HandleFunc("/sum", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	})

	sc := stack.ServiceConfig()
	r := newTUNRig(t, "usit-http", 1500, sc)
	l, err := r.st.Listen("tcp", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("http.Server.Shutdown: %v", err)
		}
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("Serve: %v, want http.ErrServerClosed", err)
		}
	}()

	upload := filepath.Join(t.TempDir(), "upload")
	if err := os.WriteFile(upload, blob[:up], 0o600); err != nil {
		t.Fatal(err)
	}
	for _, v6 := range []bool{false, true} {
		t.Run("curl/"+family(v6), func(t *testing.T) {
			base := "http://" + r.stackAP(v6, 8080).String()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := r.bed.NS.Exec(ctx, curl, "-sS", "--fail", "--max-time", "50", base+"/blob")
			h := sha256.New()
			var stderr strings.Builder
			cmd.Stdout, cmd.Stderr = h, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("curl %s/blob: %v: %s", base, err, stderr.String())
			}
			if got := hex.EncodeToString(h.Sum(nil)); got != sum(blob) {
				t.Errorf("curl %s/blob: SHA-256 %s, want %s", base, got, sum(blob))
			}
			out, err := r.bed.NS.Exec(ctx, curl, "-sS", "--fail", "--max-time", "50", "--data-binary", "@"+upload, base+"/sum").Output()
			if err != nil {
				t.Fatalf("curl --data-binary %s/sum: %v", base, err)
			}
			if want := fmt.Sprintf("%d %s", up, sum(blob[:up])); string(out) != want {
				t.Errorf("upload: server read %q, want %q", out, want)
			}
		})
	}

	// The other way: ustack's http.Client to a kernel socket's server.
	for _, v6 := range []bool{false, true} {
		t.Run("client/"+family(v6), func(t *testing.T) {
			kl, err := r.bed.NS.ListenTCP(r.kernelAP(v6, 0))
			if err != nil {
				t.Fatal(err)
			}
			ks := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
			go ks.Serve(kl)
			defer ks.Close()
			tr := &http.Transport{DialContext: r.st.DialContext}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 50 * time.Second}
			url := "http://" + kl.Addr().(*net.TCPAddr).AddrPort().String()
			for i := 0; i < 2; i++ { // the second on the kept-alive connection
				resp, err := c.Get(url + "/blob")
				if err != nil {
					t.Fatalf("GET %s/blob: %v", url, err)
				}
				h := sha256.New()
				n, err := io.Copy(h, resp.Body)
				resp.Body.Close()
				if err != nil || n != down || hex.EncodeToString(h.Sum(nil)) != sum(blob) {
					t.Errorf("GET %s/blob #%d: %d bytes, %v; want %d bytes with SHA-256 %s", url, i, n, err, down, sum(blob))
				}
			}
		})
	}
}
