// Package doccheck holds a test, and nothing else: every Go code block of
// the repository's documentation (README.md and docs/*.md) compiles and
// passes go vet. See TestDocBlocksCompile for the conventions the blocks
// follow.
package doccheck
