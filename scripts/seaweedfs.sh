#!/usr/bin/env bash
# Starts or stops a local SeaweedFS (S3 on 127.0.0.1) for scripts and the demo.
#
#   scripts/seaweedfs.sh start DIR PORT   # data, log and pid under DIR; S3 at http://127.0.0.1:PORT
#   scripts/seaweedfs.sh stop  DIR [PORT]
#
# Everything binds to loopback. The server's other components (master, volume, filer, admin)
# get free ports of their own, so several instances can run on one machine. No identities are
# configured: any access key pair is accepted. `weed` comes from scripts/setup.sh.
# LARCH_S3_BIND (default 127.0.0.1) is the address it binds (e2e/realnode.sh: 0.0.0.0 inside its
# own network namespace, so pods reach S3 at the node's address).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR PORT" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 dir=$2 port=${3:-}
[ "$cmd" != start ] || mkdir -p "$dir"
[ ! -d "$dir" ] || dir=$(cd "$dir" && pwd)
cache=${LARCH_CACHE:-$HOME/.cache/larch}
weed=$cache/venv/bin/weed
pidfile=$dir/weed.pid

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

# Prints free loopback ports: N distinct ones, then one p with p+10000 free (the admin server
# always puts its gRPC port there).
free_ports() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
held = []
for _ in range(n):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); held.append(s)
ports = [s.getsockname()[1] for s in held]
for _ in range(500):
    p = random.randint(20000, 55000)
    if p in ports or p + 10000 in ports:
        continue
    try:
        a = socket.socket(); a.bind(("127.0.0.1", p))
        b = socket.socket(); b.bind(("127.0.0.1", p + 10000))
    except OSError:
        continue
    ports.append(p); break
else:
    sys.exit("no free port pair")
print(" ".join(map(str, ports)))
EOF
}

s3_answers() {
  python3 - "$1" <<'EOF'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
    s.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    s.settimeout(2)
    sys.exit(0 if s.recv(12)[9:12] == b"200" else 1)
except OSError:
    sys.exit(1)
EOF
}

case $cmd in
start)
  [ -n "$port" ] || usage
  [ -x "$weed" ] || { echo "seaweedfs: $weed not found: run scripts/setup.sh" >&2; exit 1; }
  if running; then
    echo "seaweedfs: already running (pid $(cat "$pidfile")), S3 at http://127.0.0.1:$port"
    exit 0
  fi
  mkdir -p "$dir/data"
  # Saved options of an earlier run would bring back its (possibly taken) ports.
  rm -f "$dir/data/mini.options"
  # -volume.max: each bucket takes a volume of its own. Left at 0 the limit is free disk / 128 MB,
  # and with little free disk later buckets get HTTP 500 on every PUT. Volumes are not
  # preallocated, so a high count costs nothing.
  read -r s3grpc master mastergrpc volume volumegrpc filer filergrpc admin <<<"$(free_ports 7)"
  (
    unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY S3_BUCKET S3_TABLE_BUCKET
    exec setsid "$weed" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind="${LARCH_S3_BIND:-127.0.0.1}" \
      -s3.port="$port" -s3.port.grpc="$s3grpc" \
      -master.port="$master" -master.port.grpc="$mastergrpc" \
      -volume.port="$volume" -volume.port.grpc="$volumegrpc" \
      -filer.port="$filer" -filer.port.grpc="$filergrpc" \
      -admin.port="$admin" -admin.ui=false -volume.max=1000 \
      -s3.port.iceberg=0 -s3.port.lance=0 -webdav=false -master.telemetry=false
  ) >"$dir/weed.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  echo "$port $s3grpc $master $mastergrpc $volume $volumegrpc $filer $filergrpc $admin $((admin + 10000))" >"$dir/weed.ports"
  for _ in $(seq 1 300); do
    if s3_answers "$port"; then
      echo "seaweedfs: S3 at http://127.0.0.1:$port (pid $(cat "$pidfile"), log $dir/weed.log)"
      exit 0
    fi
    if ! running; then break; fi
    sleep 0.2
  done
  echo "seaweedfs: did not start on 127.0.0.1:$port; last lines of $dir/weed.log:" >&2
  tail -n 20 "$dir/weed.log" >&2 || true
  if running; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  rm -f "$pidfile"
  exit 1
  ;;
stop)
  if ! running; then
    echo "seaweedfs: not running ($dir)"
    rm -f "$pidfile"
    exit 0
  fi
  pid=$(cat "$pidfile")
  kill -TERM "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  # weed leaves some of its /tmp/seaweedfs-<component>-<port>.sock behind; remove ours.
  for p in $(cat "$dir/weed.ports" 2>/dev/null); do rm -f /tmp/seaweedfs-*-"$p".sock; done
  rm -f "$pidfile" "$dir/weed.ports"
  echo "seaweedfs: stopped"
  ;;
*) usage ;;
esac
