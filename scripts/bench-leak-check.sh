#!/usr/bin/env bash
# Leak check benchmark (printed figures, not a timed test; issue 38):
#   a masked one-shot `larch export` of scripts/sample/events.sql (or $LARCH_EVENTS_SQL) and
#   `larch archive leak-check` of the archive it wrote, alternating LARCH_BENCH_REPEAT times
#   (default 3) in the same run; prints each figure's median, the peak RSS of each, and the
#   ratio leak-check/export (the issue's target: <= 1.5).
# Usage: scripts/bench-leak-check.sh [ROWS]   (default 200000)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rows=${1:-200000}
repeat=${LARCH_BENCH_REPEAT:-3}
work=$(mktemp -d); chmod 755 "$work"
port=${LARCH_BENCH_PG_PORT:-55437}
larch=${LARCH_BIN:-$here/target/release/larch}
[ -x "$larch" ] || { echo "build it first: cargo build --release" >&2; exit 1; }
cleanup() {
  bash "$here/scripts/postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$here/scripts/postgres.sh" start "$work/pg" "$port"
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
echo "loading $rows rows of events.sql ..."
psql -q -v rows="$rows" -f "${LARCH_EVENTS_SQL:-$here/scripts/sample/events.sql}" >/dev/null
psql -q -c "VACUUM (FREEZE, ANALYZE) public.events" -c "CHECKPOINT"
dsn="host=127.0.0.1 port=$port user=postgres dbname=postgres"
cat > "$work/mask.yaml" <<'YAML'
tables:
  public.events:
    undeclared: keep
    columns:
      id: hash
      kind: hash
      ref: hash
      tenant: {fake: city}
      payload: {redact: "REDACTED"}
      blob: null
YAML
head -c 32 /dev/urandom | base64 > "$work/mask.key"

measure() { # series, label, command...: seconds and peak RSS (KiB) appended to the series
  local series=$1 label=$2; shift 2
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>"$work/err" \
    || { rc=$?; [ "$series" = leak ] && [ "$rc" -eq 1 ] || { cat "$work/err" >&2; exit 1; }; }
  read -r secs rss < "$work/time"
  printf '%-40s %8.2f s   peak RSS %8.1f MiB\n' "$label" "$secs" "$(echo "$rss/1024" | bc -l)"
  echo "$secs $rss" >> "$work/series-$series"
}
median() { # series, label
  local secs rss
  secs=$(sort -n "$work/series-$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  rss=$(sort -n -k2 "$work/series-$1" | tail -1 | cut -d' ' -f2)
  printf '%-40s %8.2f s   peak RSS %8.1f MiB   (median of %d runs)\n' "$2" "$secs" "$(echo "$rss/1024" | bc -l)" "$(wc -l < "$work/series-$1")"
  echo "$secs" > "$work/last"
}
# One untimed export first (the machine's first writes after the load cost more).
"$larch" export --connection "$dsn" --table events --store local --path "$work/warm" \
  --transform "$work/mask.yaml" --transform-key-file "$work/mask.key" >/dev/null 2>&1
rm -rf "$work/warm"
for run in $(seq 1 "$repeat"); do
  rm -rf "$work/archive"
  measure export "larch export (masked), run $run" "$larch" export --connection "$dsn" \
    --table events --store local --path "$work/archive" --transform "$work/mask.yaml" \
    --transform-key-file "$work/mask.key"
  measure leak "larch archive leak-check, run $run" "$larch" archive leak-check \
    --connection "$dsn" --store local --path "$work/archive" --table events
done
"$larch" archive leak-check --connection "$dsn" --store local --path "$work/archive" \
  --table events --no-record || true
median export "larch export (masked)"; export_secs=$(cat "$work/last")
median leak "larch archive leak-check"; leak_secs=$(cat "$work/last")
printf 'ratio leak-check/export: %.2f (target <= 1.5)\n' "$(echo "$leak_secs/$export_secs" | bc -l)"
