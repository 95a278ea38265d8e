#!/usr/bin/env bash
# The Go toolchain that builds the e2e control plane and helm (e2e/build.sh): Go 1.26 or newer.
#
#   scripts/go.sh find      print the path of a suitable `go`, or exit 1
#   scripts/go.sh install   the same, installing Go 1.26 first when none is found (scripts/setup.sh)
#
# Looked for, in order: $LARCH_GO, `go` on PATH, /usr/local/go/bin/go, and the toolchain this
# script installs ($LARCH_CACHE/go/toolchain/bin/go). To install, a bootstrap `go` of any version
# (Debian's golang-go when there is none: 1.19 on bookworm) downloads the module
# golang.org/toolchain@v0.0.1-go$LARCH_GO_VERSION.linux-<arch> from the Go module proxy — the
# module GOTOOLCHAIN=go1.26.x itself fetches, verified against the Go checksum database — into
# $LARCH_CACHE/go/mod, the module cache e2e/build.sh uses.
set -euo pipefail
cache=${LARCH_CACHE:-$HOME/.cache/larch}
want=${LARCH_GO_VERSION:-1.26.8}
toolchain_link="$cache/go/toolchain"

die() { echo "go.sh: $*" >&2; exit 1; }

# go_ok GO -> success when GO runs and is at least 1.26
go_ok() {
  local v
  v=$(GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null) || return 1
  [[ "$v" =~ ^go1\.([0-9]+) ]] || return 1
  ((BASH_REMATCH[1] >= 26))
}

find_go() {
  local candidates=()
  [ -n "${LARCH_GO:-}" ] && candidates+=("$LARCH_GO")
  command -v go >/dev/null 2>&1 && candidates+=("$(command -v go)")
  candidates+=(/usr/local/go/bin/go "$toolchain_link/bin/go")
  for g in "${candidates[@]}"; do
    if [ -x "$g" ] && go_ok "$g"; then
      echo "$g"
      return 0
    fi
  done
  return 1
}

install_go() {
  local boot
  boot=$(command -v go 2>/dev/null || true)
  if [ -z "$boot" ]; then
    echo "go.sh: no Go found; installing Debian's golang-go to bootstrap Go $want" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq golang-go >/dev/null
    boot=$(command -v go) || die "golang-go installed no go command"
  fi
  local arch
  case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "unsupported machine $(uname -m)" ;;
  esac
  local module="golang.org/toolchain@v0.0.1-go$want.linux-$arch"
  echo "go.sh: downloading $module with $("$boot" version | cut -d' ' -f3) (module proxy, checksum database)" >&2
  local work dir
  work=$(mktemp -d)
  # in a throwaway module: old go commands download module@version only inside one
  dir=$(cd "$work" && GOTOOLCHAIN=local GO111MODULE=on GOFLAGS=-mod=mod GOMODCACHE="$cache/go/mod" \
    "$boot" mod init larch-go-bootstrap >/dev/null 2>&1 &&
    GOTOOLCHAIN=local GO111MODULE=on GOFLAGS=-mod=mod GOMODCACHE="$cache/go/mod" \
      "$boot" mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  rm -rf "$work"
  [ -n "$dir" ] && [ -d "$dir" ] || die "downloading $module failed"
  # Module zips keep no executable bits (the go command restores them the same way).
  chmod +x "$dir/bin/"* "$dir"/pkg/tool/*/*
  mkdir -p "$(dirname "$toolchain_link")"
  ln -sfn "$dir" "$toolchain_link"
  go_ok "$toolchain_link/bin/go" || die "the downloaded toolchain in $dir does not run"
  echo "go.sh: Go $want installed: $toolchain_link -> $dir" >&2
}

case "${1:-}" in
  find) find_go ;;
  install)
    find_go && exit 0
    install_go
    find_go
    ;;
  *) die "usage: $0 find|install" ;;
esac
