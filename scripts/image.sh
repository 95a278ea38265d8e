#!/usr/bin/env bash
# The container image, built and checked with podman (buildah) on a machine that cannot pull base
# images: see docs/image.md.
#
#   scripts/image.sh [build]    the substitute runtime base (if stale) + the larch image
#   scripts/image.sh base       only the runtime base: an equivalent of
#                               gcr.io/distroless/cc-debian12:nonroot made from Debian bookworm
#                               packages (apt-get download + dpkg -x)
#   scripts/image.sh test       the image's checks (below); builds it first if missing
#   scripts/image.sh save FILE  write the image as a docker-archive FILE (for `ctr images import`)
#
# The binary is built outside the image and copied in (the Dockerfile's `prebuilt` target):
# LARCH_BIN=/path/to/larch takes a binary as it is; otherwise
# `cargo build --release --locked --bin larch` in CARGO_TARGET_DIR (default $LARCH_CACHE/target).
#
# Environment:
#   LARCH_IMAGE          the image's name (default localhost/larch:dev)
#   LARCH_BIN            a prebuilt larch binary (glibc <= 2.36: built on bookworm or the same libc)
#   LARCH_RUNTIME_IMAGE  the runtime base (default: the substitute, localhost/larch-base/cc-debian12:nonroot;
#                        gcr.io/distroless/cc-debian12:nonroot where a registry can be reached)
#   LARCH_CACHE          cache root (default ~/.cache/larch); the base is assembled in $LARCH_CACHE/image
#
# Checks (`test`): the image's user is 65532:65532; as 65532:65532 on a read-only root with every
# capability dropped it runs `larch --version` and `larch operator --help`; it serves an engine from
# an archive on a mounted volume (read-only), in a network namespace the test creates: the
# process's UID/GID are 65532, its root is mounted read-only, and rows come back over HTTP.
#
# podman runs with --runtime runc (crun refuses the project machines' hybrid cgroups) and
# `default_ulimits = []` (the default ulimits cannot be set inside this sandbox): the
# containers.conf is written to $LARCH_CACHE/image/containers.conf and used through CONTAINERS_CONF.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
LARCH_CACHE=${LARCH_CACHE:-$HOME/.cache/larch}
IMAGE=${LARCH_IMAGE:-localhost/larch:dev}
SUBSTITUTE_BASE=localhost/larch-base/cc-debian12:nonroot
RUNTIME_IMAGE=${LARCH_RUNTIME_IMAGE:-$SUBSTITUTE_BASE}
work="$LARCH_CACHE/image"
mkdir -p "$work"

log() { echo "image.sh: $*" >&2; }
die() { echo "image.sh: $*" >&2; exit 1; }

deb_arch() { dpkg --print-architecture; }        # amd64 / arm64: also Docker's TARGETARCH

need_tools() {
  local pkgs=()
  command -v podman >/dev/null || pkgs+=(podman)
  command -v runc >/dev/null || pkgs+=(runc)
  command -v ip >/dev/null || pkgs+=(iproute2)
  command -v curl >/dev/null || pkgs+=(curl)
  if ((${#pkgs[@]})); then
    log "installing ${pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
  fi
  cat >"$work/containers.conf" <<'EOF'
# written by scripts/image.sh
[containers]
default_ulimits = []
[engine]
runtime = "runc"
EOF
  export CONTAINERS_CONF="$work/containers.conf"
}

# --------------------------------------------------------------------------------------------
# The substitute of gcr.io/distroless/cc-debian12:nonroot. distroless "cc" is its "base" (glibc,
# libssl3, CA certificates, tzdata, netbase, base-files, an /etc/passwd with root, nobody and
# nonroot 65532, /home/nonroot, /tmp 1777) plus libgcc-s1, libgomp1 and libstdc++6; no shell, no
# package manager. The same Debian bookworm packages, unpacked with dpkg -x (no maintainer scripts
# run: the CA bundle is concatenated here the way update-ca-certificates writes it).
BASE_PACKAGES=(base-files netbase tzdata ca-certificates libc6 libssl3 libgcc-s1 libgomp1 libstdc++6)

build_base() {
  local b="$work/base" arch; arch=$(deb_arch)
  mkdir -p "$b/debs"
  # the versions the package index offers now: the stamp of the base
  local versions
  versions=$(apt-cache policy "${BASE_PACKAGES[@]}" 2>/dev/null | awk '/^[^ ]/{p=$1} /Candidate:/{print p, $2}')
  [[ $(wc -l <<<"$versions") -eq ${#BASE_PACKAGES[@]} && "$versions" != *"(none)"* ]] || {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    versions=$(apt-cache policy "${BASE_PACKAGES[@]}" | awk '/^[^ ]/{p=$1} /Candidate:/{print p, $2}')
  }
  local stamp; stamp=$( (echo "$versions"; sed -n '/^BASE_PACKAGES=/,/^}/p' "$0") | sha256sum | cut -c1-16)
  if [[ -f "$b/stamp" && "$(cat "$b/stamp")" == "$stamp" ]] && podman image exists "$SUBSTITUTE_BASE"; then
    log "base $SUBSTITUTE_BASE up to date ($stamp)"
    return 0
  fi
  log "base: downloading ${BASE_PACKAGES[*]} (bookworm, $arch)"
  rm -rf "$b/debs" "$b/rootfs" && mkdir -p "$b/debs" "$b/rootfs"
  # apt-get download writes into the current directory; _apt cannot write a root-owned one
  (cd "$b/debs" && apt-get download -qq "${BASE_PACKAGES[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true)
  local n; n=$(ls "$b/debs"/*.deb | wc -l)
  ((n == ${#BASE_PACKAGES[@]})) || die "base: expected ${#BASE_PACKAGES[@]} packages, got $n"
  local r="$b/rootfs" d
  for d in "$b/debs"/*.deb; do dpkg-deb -x "$d" "$r"; done
  # /etc/passwd and /etc/group as distroless writes them
  mkdir -p "$r/etc" "$r/root" "$r/home/nonroot" "$r/tmp" "$r/etc/ssl/certs"
  cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat >"$r/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
  printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n' >"$r/etc/nsswitch.conf"
  # what update-ca-certificates writes with Debian's default configuration (every Mozilla CA)
  cat "$r"/usr/share/ca-certificates/mozilla/*.crt >"$r/etc/ssl/certs/ca-certificates.crt"
  [[ -s "$r/etc/ssl/certs/ca-certificates.crt" ]] || die "base: no CA certificates"
  chmod 0700 "$r/root" "$r/home/nonroot"
  chown 65532:65532 "$r/home/nonroot"
  chmod 1777 "$r/tmp"
  # documentation except the copyright files (the licences travel with the binaries)
  find "$r/usr/share/doc" -mindepth 2 ! -name copyright -exec rm -rf {} + 2>/dev/null || true
  rm -rf "$r/usr/share/man" "$r/usr/share/info" "$r/usr/share/lintian" "$r/usr/share/locale" \
         "$r/usr/share/gcc" "$r/usr/share/gdb" "$r/usr/sbin" "$r/sbin" "$r/usr/bin" "$r/bin" \
         "$r/etc/init.d" "$r/etc/ld.so.conf.d" "$r/var/lib/dpkg" 2>/dev/null || true
  # the package list distroless records (/var/lib/dpkg/status.d): what the image holds, for scanners
  mkdir -p "$r/var/lib/dpkg/status.d"
  for d in "$b/debs"/*.deb; do
    dpkg-deb -f "$d" >"$r/var/lib/dpkg/status.d/$(dpkg-deb -f "$d" Package)"
  done
  tar --sort=name --numeric-owner --mtime=@0 -C "$r" -cf "$b/rootfs.tar" .
  cat >"$b/Containerfile" <<EOF
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
LABEL org.opencontainers.image.description="larch's substitute for gcr.io/distroless/cc-debian12:nonroot, from Debian bookworm packages (scripts/image.sh base)" \\
      larch.base.packages="$(echo "$versions" | tr '\n' ',' | sed 's/,$//')"
EOF
  podman build -q --network none -f "$b/Containerfile" -t "$SUBSTITUTE_BASE" "$b" >/dev/null
  echo "$stamp" >"$b/stamp"
  log "base $SUBSTITUTE_BASE built: $(podman image inspect -f '{{.Size}}' "$SUBSTITUTE_BASE" | awk '{printf "%.1f MB", $1/1e6}')"
}

# --------------------------------------------------------------------------------------------
build_image() {
  [[ "$RUNTIME_IMAGE" != "$SUBSTITUTE_BASE" ]] || build_base
  local bin=${LARCH_BIN:-}
  if [[ -z "$bin" ]]; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$LARCH_CACHE/target}
    log "cargo build --release --locked --bin larch (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    (cd "$here" && cargo build --release --locked --bin larch)
    bin="$CARGO_TARGET_DIR/release/larch"
  fi
  [[ -x "$bin" ]] || die "no larch binary at $bin"
  local arch; arch=$(deb_arch)
  # the context of the prebuilt target: the binary only, named for its architecture
  local ctx="$work/context"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp "$bin" "$ctx/larch-$arch"
  log "building $IMAGE from $bin (target prebuilt, runtime base $RUNTIME_IMAGE)"
  podman build -q --network none --target prebuilt -f "$here/Dockerfile" \
    --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" --build-arg TARGETARCH="$arch" \
    -t "$IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  log "$IMAGE: $(podman image inspect -f '{{.Id}} {{.Size}}' "$IMAGE" | awk '{printf "%s, %.1f MB", substr($1,1,12), $2/1e6}')"
}

# --------------------------------------------------------------------------------------------
t_ns="" t_dir="" t_ctr=""
test_cleanup() {
  [[ -n "$t_ctr" ]] && podman rm -f -t 2 "$t_ctr" >/dev/null 2>&1 || true
  if [[ -n "$t_dir" && -d "$t_dir/pg/data" ]]; then
    ip netns exec "$t_ns" bash "$here/scripts/postgres.sh" stop "$t_dir/pg" >/dev/null 2>&1 || true
  fi
  [[ -n "$t_ns" ]] && ip netns delete "$t_ns" 2>/dev/null || true
  [[ -n "$t_dir" ]] && rm -rf "$t_dir"
}

check() { # DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then log "ok: $what"; else die "FAILED: $what"; fi
}

test_image() {
  podman image exists "$IMAGE" || build_image
  local t0=$SECONDS
  local run=(podman run --rm --network none --read-only --user 65532:65532 --cap-drop all
             --security-opt no-new-privileges "$IMAGE")
  check "the image's user is 65532:65532" \
    test "$(podman image inspect -f '{{.Config.User}}' "$IMAGE")" = 65532:65532
  local v; v=$("${run[@]}" --version)
  check "larch --version as 65532:65532 on a read-only root ($v)" grep -q '^larch ' <<<"$v"
  check "larch operator --help as 65532:65532 on a read-only root" \
    bash -c '"$@" | grep "Usage: larch operator" >/dev/null' _ "${run[@]}" operator --help

  # an engine from an archive on a mounted volume
  trap test_cleanup EXIT
  t_ns="larch-image-$$"
  t_dir=$(mktemp -d /var/tmp/larch-image-test.XXXXXX)
  chmod 755 "$t_dir"
  ip netns add "$t_ns"
  ip -n "$t_ns" link set lo up
  local bin=${LARCH_BIN:-}
  [[ -n "$bin" ]] || bin="${CARGO_TARGET_DIR:-$LARCH_CACHE/target}/release/larch"
  [[ -x "$bin" ]] || bin="$t_dir/larch"
  if [[ "$bin" == "$t_dir/larch" ]]; then   # the binary from the image itself
    local c; c=$(podman create "$IMAGE"); podman cp "$c:/usr/local/bin/larch" "$bin"; podman rm "$c" >/dev/null
  fi
  ip netns exec "$t_ns" bash "$here/scripts/postgres.sh" start "$t_dir/pg" 55432 >/dev/null
  local dsn="host=127.0.0.1 port=55432 user=postgres dbname=postgres"
  ip netns exec "$t_ns" env PGOPTIONS=--client-min-messages=warning psql -q "$dsn" -v rows=300 -f "$here/scripts/sample/events.sql" >/dev/null
  mkdir -p "$t_dir/archive"
  ip netns exec "$t_ns" env LARCH_PG_DSN="$dsn" "$bin" export --table public.events --store local \
    --path "$t_dir/archive" >"$t_dir/export.log" 2>&1 || { cat "$t_dir/export.log" >&2; die "export failed"; }
  ip netns exec "$t_ns" bash "$here/scripts/postgres.sh" stop "$t_dir/pg" >/dev/null
  rm -rf "$t_dir/pg"
  chmod -R a+rX "$t_dir/archive"
  cat >"$t_dir/engine.yaml" <<'EOF'
sources:
  events:
    type: archive
    store: {type: local, path: /archive}
    key_prefix: public.events/
tables:
  - source: events
    schema: public
    table: events
    targets: [{type: memory, index_fields: [tenant]}]
EOF
  chmod 644 "$t_dir/engine.yaml"
  t_ctr=$(podman run -d --network ns:/run/netns/"$t_ns" --read-only --user 65532:65532 \
    --cap-drop all --security-opt no-new-privileges --tmpfs /tmp:rw,size=16m \
    -v "$t_dir/archive:/archive:ro" -v "$t_dir/engine.yaml:/etc/larch/engine.yaml:ro" \
    "$IMAGE" engine --config /etc/larch/engine.yaml)
  local i
  for i in $(seq 120); do
    ip netns exec "$t_ns" curl -sf http://127.0.0.1:8080/health/ready >/dev/null && break
    [[ "$(podman inspect -f '{{.State.Running}}' "$t_ctr")" == true ]] || { podman logs "$t_ctr" >&2; die "engine exited"; }
    sleep 0.5
  done
  local pid; pid=$(podman inspect -f '{{.State.Pid}}' "$t_ctr")
  check "the engine's process runs as UID/GID 65532" \
    bash -c 'grep -q "^Uid:[[:space:]]*65532[[:space:]]" /proc/$1/status && grep -q "^Gid:[[:space:]]*65532[[:space:]]" /proc/$1/status' _ "$pid"
  check "the engine's root is mounted read-only" \
    bash -c 'awk '\''$5 == "/" { print $6 }'\'' /proc/$1/mountinfo | grep -q "^ro"' _ "$pid"
  check "the engine's process has no capabilities" grep -q '^CapEff:[[:space:]]*0000000000000000' "/proc/$pid/status"
  check "the engine is ready, in the test's network namespace" ip netns exec "$t_ns" curl -sf http://127.0.0.1:8080/health/ready -o /dev/null
  local row; row=$(ip netns exec "$t_ns" curl -sf 'http://127.0.0.1:8080/tables/public.events/row?id=42')
  check "the engine serves row 42 from the archive on the volume: $row" grep -q '"id":42' <<<"$row"
  log "image checks passed in $((SECONDS - t0))s"
  test_cleanup; t_ns="" t_dir="" t_ctr=""
  trap - EXIT
}

cmd=${1:-build}
case "$cmd" in
  base) need_tools; build_base ;;
  build) need_tools; build_image ;;
  test) need_tools; test_image ;;
  save)
    need_tools
    out=${2:?usage: image.sh save FILE}
    podman image exists "$IMAGE" || build_image
    rm -f "$out"
    podman save -q --format docker-archive -o "$out" "$IMAGE"
    log "saved $IMAGE to $out"
    ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
