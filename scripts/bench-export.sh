#!/usr/bin/env bash
# Export benchmark (printed figures, not a timed test):
#   one-shot `larch export` of scripts/sample/events.sql (or $LARCH_EVENTS_SQL) next to
#   `COPY (SELECT row_to_json(e) FROM public.events e) TO STDOUT` in the same run, with peak RSS;
#   then a continuous export under a steady update load with --diff-interval 1s and its
#   commit-to-archive lag (p50/p99 from larch_export_commit_lag_seconds).
# Usage: scripts/bench-export.sh [ROWS] [LOAD_SECONDS]   (defaults 1000000 and 30)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rows=${1:-1000000}
load_seconds=${2:-30}
work=$(mktemp -d); chmod 755 "$work"
port=${LARCH_BENCH_PG_PORT:-55433}
larch=${LARCH_BIN:-$here/target/release/larch}
[ -x "$larch" ] || { echo "build it first: cargo build --release" >&2; exit 1; }
cleanup() {
  [ -n "${follow_pid:-}" ] && kill "$follow_pid" 2>/dev/null || true
  bash "$here/scripts/postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$here/scripts/postgres.sh" start "$work/pg" "$port"
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
echo "loading $rows rows of events.sql ..."
psql -q -v rows="$rows" -f "${LARCH_EVENTS_SQL:-$here/scripts/sample/events.sql}" >/dev/null
dsn="host=127.0.0.1 port=$port user=postgres dbname=postgres"

measure() { # label, command...: prints seconds and peak RSS (KiB)
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  read -r secs rss < "$work/time"
  printf '%-44s %8.2f s   peak RSS %8.1f MiB\n' "$label" "$secs" "$(echo "$rss/1024" | bc -l)"
  echo "$secs"  > "$work/last"
}
measure "COPY (SELECT row_to_json(e) ...) TO STDOUT" psql -c "COPY (SELECT row_to_json(e) FROM public.events e) TO STDOUT"
copy_secs=$(cat "$work/last")
measure "larch export (one-shot, jsonl, local)" "$larch" export --connection "$dsn" --table events --store local --path "$work/archive"
export_secs=$(cat "$work/last")
printf 'ratio export/COPY: %.2f (target <= 1.0)\n' "$(echo "$export_secs/$copy_secs" | bc -l)"

echo "continuous: --diff-interval 1s, ${load_seconds}s of single-row updates ..."
LARCH_PG_DSN=$dsn LARCH_LOG=warn "$larch" export --follow --table events --store local --path "$work/follow" \
  --diff-interval 1s --listen 127.0.0.1:0 --slot bench_follow 2>"$work/follow.log" &
follow_pid=$!
for _ in $(seq 1 600); do
  addr=$(sed -n 's/.*status on http:\/\/\([^)]*\)).*/\1/p' "$work/follow.log" | head -1)
  [ -n "$addr" ] && curl -sf "http://$addr/health/ready" >/dev/null 2>&1 && break
  sleep 0.5
done
cat > "$work/update.sql" <<'SQL'
\set id random(1, :rows)
UPDATE public.events SET amount = amount + 1 WHERE id = :id;
SQL
pgbench -n -c 2 -T "$load_seconds" -R 200 -D rows="$rows" -f "$work/update.sql" postgres 2>&1 | grep -E "tps|latency average|error" || true
sleep 3
curl -s "http://$addr/metrics" > "$work/metrics"
python3 - "$work/metrics" <<'PY'
import re, sys
buckets, count = [], 0
for line in open(sys.argv[1]):
    m = re.match(r'larch_export_commit_lag_seconds_bucket\{.*le="([^"]+)"\} (\d+)', line)
    if m:
        buckets.append((float('inf') if m.group(1) == '+Inf' else float(m.group(1)), int(m.group(2))))
    m = re.match(r'larch_export_commit_lag_seconds_count\{.*\} (\d+)', line)
    if m:
        count = int(m.group(1))
def q(p):
    want = p * count
    for le, c in sorted(buckets):
        if c >= want:
            return le
print(f"commit-to-archive lag over {count} changes: p50 <= {q(0.5)} s, p99 <= {q(0.99)} s (histogram bucket bounds)")
PY
kill -TERM "$follow_pid"; wait "$follow_pid" || true; follow_pid=
