#!/usr/bin/env bash
# Several-table export benchmark (printed figures, not a timed test): TABLES copies of
# scripts/sample/events.sql (ROWS rows each) exported in one `larch export` at one position,
# first with --parallel 1 (the tables one after another) and then with --parallel TABLES, in the
# same run; wall time, peak RSS and the ratio. The speedup is bounded by the machine's cores
# (PostgreSQL's COPY and larch's encoding each take one per table in flight).
# Usage: scripts/bench-parallel-export.sh [ROWS] [TABLES]   (defaults 250000 and 4)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rows=${1:-250000}
tables=${2:-4}
work=$(mktemp -d); chmod 755 "$work"
port=${LARCH_BENCH_PG_PORT:-55434}
larch=${LARCH_BIN:-$here/target/release/larch}
[ -x "$larch" ] || { echo "build it first: cargo build --release" >&2; exit 1; }
cleanup() {
  bash "$here/scripts/postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$here/scripts/postgres.sh" start "$work/pg" "$port"
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres PGOPTIONS="-c client_min_messages=warning"
echo "loading $tables tables of $rows rows of events.sql ..."
table_args=()
for i in $(seq 1 "$tables"); do
  psql -q -v rows="$rows" -f "${LARCH_EVENTS_SQL:-$here/scripts/sample/events.sql}" >/dev/null
  psql -q -c "ALTER TABLE public.events RENAME TO events_$i"
  table_args+=(--table "events_$i")
done
psql -q -c "CHECKPOINT"
dsn="host=127.0.0.1 port=$port user=postgres dbname=postgres"

measure() { # label, command...: prints seconds and peak RSS (KiB)
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  read -r secs rss < "$work/time"
  printf '%-48s %8.2f s   peak RSS %8.1f MiB\n' "$label" "$secs" "$(echo "$rss/1024" | bc -l)"
  echo "$secs" > "$work/last"
}
# Warm the cache the same way for both runs.
for i in $(seq 1 "$tables"); do psql -q -c "COPY public.events_$i TO STDOUT" >/dev/null; done
measure "larch export, $tables tables, --parallel 1" \
  "$larch" export --connection "$dsn" "${table_args[@]}" --parallel 1 --store local --path "$work/p1"
seq_secs=$(cat "$work/last")
measure "larch export, $tables tables, --parallel $tables" \
  "$larch" export --connection "$dsn" "${table_args[@]}" --parallel "$tables" --store local --path "$work/pn"
par_secs=$(cat "$work/last")
printf 'speedup --parallel %s over --parallel 1: %.2fx (on %s cores)\n' \
  "$tables" "$(echo "$seq_secs/$par_secs" | bc -l)" "$(nproc)"
