package doccheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// A Block is one ```go block of a Markdown file.
type Block struct {
	File string // path relative to the module root
	Path string // absolute path, which errors name
	Line int    // line of the block's first code line
	Code string
}

// ExtractBlocks returns the ```go blocks of md in order. Other fences
// (```, ```sh) are skipped whole; a block's code is the lines between its
// fences.
func ExtractBlocks(file string, md []byte) ([]Block, error) {
	var blocks []Block
	lines := strings.Split(string(md), "\n")
	for i := 0; i < len(lines); i++ {
		fence := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(fence, "```") {
			continue
		}
		lang := strings.TrimSpace(strings.TrimPrefix(fence, "```"))
		start := i + 1
		j := start
		for j < len(lines) && strings.TrimSpace(lines[j]) != "```" {
			j++
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%s:%d: unterminated code fence", file, i+1)
		}
		if lang == "go" {
			blocks = append(blocks, Block{File: file, Line: start + 1, Code: strings.Join(lines[start:j], "\n")})
		}
		i = j
	}
	return blocks, nil
}

// imports are the packages a fragment may name without importing them:
// the identifier it names them by, and the path the wrapper imports.
var imports = map[string]string{
	"bufio":      "bufio",
	"bytes":      "bytes",
	"context":    "context",
	"errors":     "errors",
	"fmt":        "fmt",
	"io":         "io",
	"log":        "log",
	"net":        "net",
	"http":       "net/http",
	"netip":      "net/netip",
	"os":         "os",
	"signal":     "os/signal",
	"exec":       "os/exec",
	"runtime":    "runtime",
	"strings":    "strings",
	"sync":       "sync",
	"syscall":    "syscall",
	"testing":    "testing",
	"time":       "time",
	"prometheus": "github.com/prometheus/client_golang/prometheus",
	"promhttp":   "github.com/prometheus/client_golang/prometheus/promhttp",
	"bufpool":    "github.com/ustack/ustack/bufpool",
	"cpumap":     "github.com/ustack/ustack/cpumap",
	"driver":     "github.com/ustack/ustack/driver",
	"gro":        "github.com/ustack/ustack/gro",
	"stack":      "github.com/ustack/ustack/stack",
	"serve":      "github.com/ustack/ustack/stack/serve",
	"stackprom":  "github.com/ustack/ustack/stack/stackprom",
	"stacktest":  "github.com/ustack/ustack/stack/stacktest",
}

// givenRE matches a fragment's first line declaring its givens.
var givenRE = regexp.MustCompile(`^//\s*given:\s*(.+)$`)

// Source returns the Go file that compiles b: b itself if it is a file,
// else the fragment wrapped as TestDocBlocksCompile describes. The block's
// code is preceded by a //line directive, so that the compiler names
// b.Path and its line.
func (b Block) Source() (string, error) {
	code := b.Code
	line := fmt.Sprintf("//line %s:%d\n", b.Path, b.Line)
	if strings.HasPrefix(strings.TrimSpace(code), "package ") {
		return line + code + "\n", nil
	}
	var params string
	if first, _, _ := strings.Cut(code, "\n"); givenRE.MatchString(strings.TrimSpace(first)) {
		params = givenRE.FindStringSubmatch(strings.TrimSpace(first))[1]
	}
	var paths []string
	seen := map[string]bool{}
	var s scanner.Scanner
	fset := token.NewFileSet()
	src := []byte(params + "\n" + code)
	s.Init(fset.AddFile("", -1, len(src)), src, nil, 0)
	prevIdent := ""
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.PERIOD && prevIdent != "" {
			if p, ok := imports[prevIdent]; ok && !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
		}
		prevIdent = ""
		if tok == token.IDENT {
			prevIdent = lit
		}
	}
	sort.Strings(paths)
	var f strings.Builder
	f.WriteString("package main\n\n")
	for _, p := range paths {
		fmt.Fprintf(&f, "import %q\n", p)
	}
	fmt.Fprintf(&f, "\nfunc main() {}\n\nfunc _(%s) error {\n", params)
	f.WriteString(line)
	f.WriteString(code)
	f.WriteString("\n")
	if !terminates(code) {
		f.WriteString("return nil\n")
	}
	f.WriteString("}\n")
	return f.String(), nil
}

// terminates reports whether code, a function body, ends in a terminating
// statement after which `return nil` would be unreachable: a return, a
// panic, or a for loop without a condition (and, as the Go spec's
// terminating statements, no break of its own; a doc block's endless loop
// returns from inside). A body that does not parse is left to the
// compiler, which reports it.
func terminates(code string) bool {
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+code+"\n}\n", parser.SkipObjectResolution)
	if err != nil {
		return false
	}
	body := f.Decls[len(f.Decls)-1].(*ast.FuncDecl).Body.List
	if len(body) == 0 {
		return false
	}
	switch st := body[len(body)-1].(type) {
	case *ast.ReturnStmt:
		return true
	case *ast.ForStmt:
		return st.Cond == nil
	case *ast.ExprStmt:
		call, ok := st.X.(*ast.CallExpr)
		if !ok {
			return false
		}
		id, ok := call.Fun.(*ast.Ident)
		return ok && id.Name == "panic"
	}
	return false
}

// moduleRoot returns the directory of the module's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// docFiles are the Markdown files whose Go blocks must compile, relative
// to the module root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	return files
}

// TestDocBlocksCompile checks that every ```go block of README.md and
// docs/*.md compiles and passes go vet, as a program of this module (so it
// compiles against the packages as they are). A block is one of two kinds:
//
//   - A complete file: its first line starts with `package`. It is built
//     as it is, in a directory of its own (package main needs func main).
//
//   - A function body: anything else. It is compiled as the body of
//     `func _(GIVENS) error`, followed by `return nil` unless it ends in a
//     terminating statement (a return, an endless for loop, a panic). GIVENS are what its optional first
//     line declares, `// given: s *stack.Stack, ctx context.Context` (Go
//     parameter syntax): the variables the text around the block defines
//     for it. The body must use what it declares, as any Go function
//     must, and handles errors by returning them (`return err`), never
//     `...`. The packages it names (`stack.`, `netip.`, `http.`) are
//     imported for it from the table imports (the standard library's
//     usual ones and this module's public packages), as goimports would;
//     a package outside the table needs a complete file.
//
// Each block is its own package main in an empty directory
// _doccheck*/NAME of the module, its file given in a go -overlay (no Go
// file is written to the tree); one go vet builds them all. Errors name the Markdown file and
// line (a //line directive precedes each block's code).
func TestDocBlocksCompile(t *testing.T) {
	root := moduleRoot(t)
	var blocks []Block
	for _, f := range docFiles(t, root) {
		md, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		bs, err := ExtractBlocks(f, md)
		if err != nil {
			t.Fatal(err)
		}
		for i := range bs {
			bs[i].Path = filepath.Join(root, f)
		}
		blocks = append(blocks, bs...)
	}
	if len(blocks) == 0 {
		t.Fatal("no ```go blocks found in README.md and docs/*.md")
	}
	// The blocks' files are written to a temporary directory outside the
	// tree and overlaid (go build -overlay) on empty directories of the
	// module, so that they compile as the module's code and no Go file
	// appears in the working tree (gofmt -l . stays quiet). vet runs in
	// each package's directory, so the directories exist, empty, under
	// one named _doccheck* (./... skips it), removed at the end.
	tmp := t.TempDir()
	dirs, err := os.MkdirTemp(root, "_doccheck")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dirs) })
	overlay := map[string]string{}
	var pkgs []string
	for i, b := range blocks {
		src, err := b.Source()
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("b%02d_%s_%d", i, strings.NewReplacer("/", "_", ".", "_").Replace(b.File), b.Line)
		real := filepath.Join(tmp, name+".go")
		if err := os.WriteFile(real, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(dirs, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(dir, "main.go")] = real
		pkgs = append(pkgs, "./"+filepath.Base(dirs)+"/"+name)
	}
	js, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayFile, js, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.CommandContext(ctx, gobin, append([]string{"vet", "-overlay", overlayFile}, pkgs...)...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("go vet of the documentation's %d Go blocks: %v\n%s", len(blocks), err, out.String())
	}
	t.Logf("%d Go blocks checked", len(blocks))
}
