#!/usr/bin/env bash
# The whole local environment of larch's end-to-end scenarios and of the demo, as local processes:
# a Kubernetes control plane (e2e/cluster.sh), PostgreSQL 15 with a sample of events.sql
# (scripts/postgres.sh), SeaweedFS (scripts/seaweedfs.sh) and the fake kubelet
# (e2e/fake-kubelet) that runs every pod with the `larch` image as a local `larch` process.
#
#   e2e/env.sh up DIR      start everything under DIR; writes DIR/env (shell syntax, see below)
#   e2e/env.sh down DIR    stop everything started under DIR (whatever state it is in), remove DIR
#
# Environment of `up`:
#   LARCH_BIN          the larch binary the `larch` image maps to (required)
#   LARCH_FAKE_KUBELET the larch-fake-kubelet binary (required)
#   LARCH_SAMPLE_ROWS  rows of public.events (default 2000)
#   LARCH_EVENTS_SQL   the sample script (default: scripts/sample/events.sql)
#
# DIR/env afterwards: KUBECONFIG, KUBECTL, HELM, LARCH_E2E_PG_PORT, LARCH_E2E_PG_DSN (database
# `app`, user postgres, trust), LARCH_E2E_S3_ENDPOINT (any access key pair is accepted),
# LARCH_E2E_LARCH (the binary pods run), LARCH_E2E_KUBELET_DATA (pod logs under <ns>/<pod>/).
#
# PostgreSQL's directory is /var/tmp/larch-e2e-pg-<hash of DIR> (as root it runs as the postgres
# user, which cannot traverse /root). Pods run as uid 65532 and cannot traverse /root either, so
# the larch binary is linked (or copied) into
# a world-readable directory under /var/tmp first (not /tmp: pods mount an emptyDir there).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${LARCH_CACHE:-$HOME/.cache/larch}
export LARCH_CACHE=$cache

die() { echo "env.sh: $*" >&2; exit 1; }
log() { echo "env.sh: $*" >&2; }

[ $# -eq 2 ] || die "usage: $0 up|down DIR"
cmd=$1 dir=$2
[[ "$dir" == /* ]] || dir="$PWD/$dir"
dir=${dir%/}
[ -n "$dir" ] && [ "$dir" != / ] || die "refusing DIR=/"
hash=$(echo -n "$dir" | sha256sum | cut -c1-12)
bindir="/var/tmp/larch-e2e-bin-$hash"
# PostgreSQL runs as the postgres user when started as root, which cannot traverse /root.
pgdir="/var/tmp/larch-e2e-pg-$hash"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

stop_kubelet() {
  local pidfile="$dir/kubelet.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

cmd_down() {
  [ -d "$dir" ] || { log "$dir does not exist, nothing to stop"; return 0; }
  # The kubelet first: it kills every pod process it runs.
  stop_kubelet
  [ -d "$dir/cluster" ] && bash "$here/e2e/cluster.sh" down "$dir/cluster" >/dev/null 2>&1 || true
  [ -d "$dir/s3" ] && bash "$here/scripts/seaweedfs.sh" stop "$dir/s3" >/dev/null 2>&1 || true
  [ -d "$pgdir" ] && bash "$here/scripts/postgres.sh" stop "$pgdir" >/dev/null 2>&1 || true
  rm -rf "$bindir" "$pgdir" "$dir"
  log "stopped and removed $dir"
}

wait_node_ready() {
  local t0=$SECONDS
  until "$KUBECTL" --kubeconfig "$KUBECONFIG" get node larch-node \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True; do
    kill -0 "$(cat "$dir/kubelet.pid")" 2>/dev/null || { tail -n 30 "$dir/kubelet.log" >&2; die "the fake kubelet exited"; }
    ((SECONDS - t0 < 120)) || { tail -n 30 "$dir/kubelet.log" >&2; die "node larch-node not Ready after 120s"; }
    sleep 0.5
  done
}

cmd_up() {
  [ -x "${LARCH_BIN:-}" ] || die "LARCH_BIN must name the larch binary"
  [ -x "${LARCH_FAKE_KUBELET:-}" ] || die "LARCH_FAKE_KUBELET must name the larch-fake-kubelet binary"
  local sql=${LARCH_EVENTS_SQL:-$here/scripts/sample/events.sql}
  [ -f "$sql" ] || die "sample script $sql not found (LARCH_EVENTS_SQL)"
  local rows=${LARCH_SAMPLE_ROWS:-2000}
  # Pods mount an emptyDir on /tmp: volume sources of the fake kubelet under /tmp would be hidden
  # from the pod's own later bind mounts.
  [[ "$dir/" != /tmp/* ]] || die "DIR must not be under /tmp (pods mount an emptyDir there); use /var/tmp"
  [ ! -e "$dir/env" ] || die "$dir already holds an environment; run: $0 down $dir"
  mkdir -p "$dir"
  local t0=$SECONDS

  # ---- control plane
  bash "$here/e2e/cluster.sh" up "$dir/cluster" >"$dir/cluster.log" 2>&1 \
    || { cat "$dir/cluster.log" >&2; die "control plane did not start"; }
  KUBECONFIG="$dir/cluster/kubeconfig"
  KUBECTL="$cache/bin/kubectl"
  log "control plane up ($((SECONDS - t0))s)"

  # ---- PostgreSQL 15 + sample
  local pg_port; pg_port=$(free_port)
  bash "$here/scripts/postgres.sh" start "$pgdir" "$pg_port"
  local psql=/usr/lib/postgresql/15/bin/psql
  "$psql" -q -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -c "CREATE DATABASE app" >/dev/null
  PGOPTIONS="-c client_min_messages=warning" "$psql" -q -h 127.0.0.1 -p "$pg_port" -U postgres -d app -v rows="$rows" -f "$sql" >/dev/null
  log "PostgreSQL 15 on 127.0.0.1:$pg_port, app.public.events has $rows rows ($((SECONDS - t0))s)"

  # ---- SeaweedFS
  local s3_port; s3_port=$(free_port)
  bash "$here/scripts/seaweedfs.sh" start "$dir/s3" "$s3_port" >/dev/null
  log "SeaweedFS S3 at http://127.0.0.1:$s3_port ($((SECONDS - t0))s)"

  # ---- fake kubelet
  mkdir -p "$bindir"
  chmod 755 "$bindir"
  ln -f "$LARCH_BIN" "$bindir/larch" 2>/dev/null || cp "$LARCH_BIN" "$bindir/larch"
  chmod 755 "$bindir/larch"
  setsid "$LARCH_FAKE_KUBELET" --kubeconfig "$KUBECONFIG" --data-dir "$dir/kubelet" \
    --binary "larch=$bindir/larch" --pass-env RUST_LOG --pass-env LARCH_LOG \
    >"$dir/kubelet.log" 2>&1 </dev/null &
  echo $! >"$dir/kubelet.pid"
  wait_node_ready
  log "fake kubelet: node larch-node Ready ($((SECONDS - t0))s)"

  cat >"$dir/env" <<EOF
export KUBECONFIG=$KUBECONFIG
KUBECTL=$KUBECTL
HELM=$cache/bin/helm
LARCH_E2E_PG_PORT=$pg_port
LARCH_E2E_PG_DIR=$pgdir
LARCH_E2E_PG_DSN='host=127.0.0.1 port=$pg_port user=postgres dbname=app'
LARCH_E2E_S3_ENDPOINT=http://127.0.0.1:$s3_port
LARCH_E2E_LARCH=$bindir/larch
LARCH_E2E_KUBELET_DATA=$dir/kubelet
EOF
  log "environment up in $((SECONDS - t0))s: $dir/env"
}

case "$cmd" in
  up) cmd_up ;;
  down) cmd_down ;;
  *) die "usage: $0 up|down DIR" ;;
esac
