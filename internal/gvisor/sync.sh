#!/usr/bin/env bash
# sync.sh rebuilds internal/gvisor: src/, a copy of the gVisor module at the
# version go.mod requires, holding only the packages the repository builds
# (every gvisor.dev/gvisor package of `go list -deps -test ./...` on the
# systems CI builds, and the checklocks tool's), with patches/*.patch
# applied in order; and stock.mod and stock.sum, go.mod without the replace
# of gVisor by src/ and its go.sum, for a build against the stock module
# (`go build -modfile=internal/gvisor/stock.mod -tags stockgvisor ./...`).
#
#   internal/gvisor/sync.sh          rebuild them in place
#   internal/gvisor/sync.sh -check   rebuild them in a temporary directory and
#                                    fail, with a diff, if any byte or file
#                                    of the committed ones differs
#
# It needs bash, coreutils, diff, git (git apply: `patch` is not installed on
# a fresh Debian) and go, and the network or a module cache holding the
# stock module. See README.md.
set -euo pipefail
export LC_ALL=C # the glob and sort orders

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

check=false
case "${1-}" in
-check) check=true ;;
"") ;;
*)
	echo "usage: $0 [-check]" >&2
	exit 2
	;;
esac

mod=gvisor.dev/gvisor
rel=internal/gvisor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# go.mod replaces the module by the copy (the copy is what every build of
# the repository uses).
if ! go mod edit -print | grep -qx "replace $mod => ./$rel/src"; then
	echo "sync.sh: go.mod must replace $mod by ./$rel/src" >&2
	exit 1
fi

# stock.mod is go.mod without that replace; stock.sum is go.sum tidied for
# it (go mod tidy adds the stock module's own hashes).
cp go.mod "$tmp/stock.mod"
cp go.sum "$tmp/stock.sum"
go mod edit -dropreplace="$mod" "$tmp/stock.mod"
go mod download -modfile="$tmp/stock.mod" "$mod"
go mod tidy -modfile="$tmp/stock.mod"
dir=$(go list -modfile="$tmp/stock.mod" -m -f '{{.Dir}}' "$mod")
if [ -z "$dir" ] || [ ! -f "$dir/go.mod" ]; then
	echo "sync.sh: no module directory for $mod" >&2
	exit 1
fi

# The packages: the stock module's import graph of the repository's
# packages and tests, on each system CI builds (and arm64, where imports
# differ), and of the checklocks vet tool (a tool of go.mod).
pkgs=$(
	for t in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 freebsd/amd64 windows/amd64; do
		GOOS=${t%/*} GOARCH=${t#*/} go list -modfile="$tmp/stock.mod" -deps -test -f '{{.ImportPath}}' \
			./... "$mod/tools/checklocks/cmd/checklocks" || exit 1
	done | sed 's/ .*//' | grep "^$mod/" | sort -u
)

out=$tmp/src
mkdir -p "$out"
for f in go.mod go.sum LICENSE; do
	cp "$dir/$f" "$out/$f"
done
# copypkg copies package $1's regular files but its tests and Bazel's.
copypkg() {
	local d=${1#"$mod/"} f
	mkdir -p "$out/$d"
	for f in "$dir/$d"/*; do
		[ -f "$f" ] || continue # regular files only: subdirectories are packages of their own
		case ${f##*/} in
		*_test.go | BUILD | BUILD.bazel) continue ;;
		esac
		cp "$f" "$out/$d/"
	done
}
for p in $pkgs; do
	copypkg "$p"
done
# go mod tidy reads every file whatever its build tags, so the copy must
# hold what any copied file imports too (pkg/sync's lockdep and checklocks
# files import pkg/goid): add imported packages until none is missing.
while :; do
	more=$(grep -rhoE --include='*.go' '^[[:space:]]*(import[[:space:]]+)?([A-Za-z_.][A-Za-z0-9_]*[[:space:]]+)?"'"$mod"'/[^"]+"' "$out" |
		sed 's/.*"\(.*\)"/\1/' | sort -u |
		while read -r p; do
			compgen -G "$out/${p#"$mod/"}/*.go" >/dev/null || echo "$p"
		done)
	[ -n "$more" ] || break
	for p in $more; do
		if ! compgen -G "$dir/${p#"$mod/"}/*.go" >/dev/null; then
			echo "sync.sh: $p, imported in the copy, is no package of $mod" >&2
			exit 1
		fi
		copypkg "$p"
	done
done
# The module cache's files are read-only.
find "$out" -type d -exec chmod 0755 {} +
find "$out" -type f -exec chmod 0644 {} +

# The patches, in order. git apply outside any repository (the ceiling
# keeps it from finding one above the temporary directory) works as patch
# -p1 does.
for p in "$here"/patches/*.patch; do
	[ -e "$p" ] || continue
	if ! (cd "$out" && GIT_CEILING_DIRECTORIES="$tmp" git apply -p1 --whitespace=nowarn "$p"); then
		echo "sync.sh: ${p#"$root/"} does not apply to $mod@$(go list -modfile="$tmp/stock.mod" -m -f '{{.Version}}' "$mod")" >&2
		exit 1
	fi
done

if $check; then
	bad=0
	diff -ru --label "$rel/stock.mod (committed)" --label "$rel/stock.mod (rebuilt)" "$rel/stock.mod" "$tmp/stock.mod" || bad=1
	diff -ru --label "$rel/stock.sum (committed)" --label "$rel/stock.sum (rebuilt)" "$rel/stock.sum" "$tmp/stock.sum" || bad=1
	diff -ru "$rel/src" "$out" || bad=1
	if [ "$bad" -ne 0 ]; then
		echo "sync.sh -check: $rel differs from the stock module and patches (above: committed, then rebuilt); run $rel/sync.sh" >&2
		exit 1
	fi
	exit 0
fi

rm -rf "${rel:?}/src"
mv "$out" "$rel/src"
cp "$tmp/stock.mod" "$tmp/stock.sum" "$rel/"
