#!/usr/bin/env bash
# Split export benchmark (printed figures, not a timed test): one-shot exports of
# scripts/sample/events.sql (or $LARCH_EVENTS_SQL) to a local archive by
#   `COPY (SELECT row_to_json(e) FROM public.events e) TO STDOUT` through psql (the baseline),
#   `COPY public.events TO STDOUT` (COPY text, what larch reads),
#   `pg_dump -Fd -j N -t public.events` (N = 1, 2, 4: pg_dump's jobs split work by table, so
#   one table is one stream whatever N; a directory dump, compressed by default),
#   `larch export --split N` (N = 1, 2, 4),
# in the same run, alternating LARCH_BENCH_REPEAT times (default 3; each figure the median):
# wall time, the client's CPU seconds and peak RSS, and the server's CPU seconds (its backends'
# user+system time, read from the postmaster's children's time when they exit). Every archive
# is checked with `larch archive verify` and its row count against the table.
# Usage: scripts/bench-split-export.sh [ROWS...]   (default 1000000; e.g. 1000000 5000000)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# Several sizes in one run: each size is a run of its own (its own database and table).
if [ $# -gt 1 ]; then for n in "$@"; do bash "$0" "$n"; done; exit 0; fi
rows=${1:-1000000}
work=$(mktemp -d); chmod 755 "$work"
port=${LARCH_BENCH_PG_PORT:-55435}
larch=${LARCH_BIN:-$here/target/release/larch}
[ -x "$larch" ] || { echo "build it first: cargo build --release" >&2; exit 1; }
cleanup() {
  bash "$here/scripts/postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$here/scripts/postgres.sh" start "$work/pg" "$port" >/dev/null
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
echo "loading $rows rows of events.sql ..."
psql -q -v rows="$rows" -f "${LARCH_EVENTS_SQL:-$here/scripts/sample/events.sql}" >/dev/null
psql -q -c "VACUUM (FREEZE, ANALYZE) public.events" -c "CHECKPOINT"
dsn="host=127.0.0.1 port=$port user=postgres dbname=postgres"
postmaster=$(head -1 "$work/pg/data/postmaster.pid")
tick=$(getconf CLK_TCK)
server_cpu() { # the postmaster's exited children's user+system seconds
  awk -v t="$tick" '{print ($16 + $17) / t}' "/proc/$postmaster/stat"
}
count=$(psql -At -c "SELECT count(*) FROM public.events")
# One untimed export first: the first pages written after the load cost the machine, not larch.
"$larch" export --connection "$dsn" --table events --store local --path "$work/warm" >/dev/null 2>&1
rm -rf "$work/warm"

run() { # series, command...: wall, client CPU, client RSS, server CPU into the series
  local series=$1; shift
  local before after
  before=$(server_cpu)
  /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  # A backend's time reaches the postmaster's children's time when it exits, after its client.
  until [ "$(psql -At -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")" = 0 ]; do sleep 0.05; done
  sleep 0.2
  after=$(server_cpu)
  read -r secs user sys rss < "$work/time"
  echo "$secs $(echo "$user + $sys" | bc -l) $rss $(echo "$after - $before" | bc -l)" >> "$work/series-$series"
}

for r in $(seq 1 "${LARCH_BENCH_REPEAT:-3}"); do
  echo "run $r ..."
  run copy_json psql -c "COPY (SELECT row_to_json(e) FROM public.events e) TO STDOUT"
  run copy_text psql -c "COPY public.events TO STDOUT"
  for n in 1 2 4; do
    rm -rf "$work/dump-$n"
    run "pg_dump_$n" pg_dump -Fd -j "$n" -t public.events -f "$work/dump-$n" postgres
    rm -rf "$work/archive-$n"
    run "larch_$n" "$larch" export --connection "$dsn" --table events --store local \
      --path "$work/archive-$n" --split "$n"
    "$larch" archive verify --path "$work/archive-$n" --table events >/dev/null
    got=$(sed -n 's/.*"row_count": *\([0-9]*\).*/\1/p' "$work/archive-$n/public.events/manifest.json" | head -1)
    [ "$got" = "$count" ] || { echo "larch_$n: $got rows, the table has $count" >&2; exit 1; }
  done
done

median() { sort -n "$work/series-$1" | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }
read -r copy_secs _ _ _ <<< "$(median copy_json)"
printf '\n%d rows, medians of %s runs (machine: %s cores)\n' "$rows" "${LARCH_BENCH_REPEAT:-3}" "$(nproc)"
printf '| export | wall | vs COPY (row_to_json) TO | client CPU | client peak RSS | server CPU |\n|---|---|---|---|---|---|\n'
for s in copy_json copy_text pg_dump_1 pg_dump_2 pg_dump_4 larch_1 larch_2 larch_4; do
  read -r secs cpu rss server <<< "$(median "$s")"
  printf '| %s | %.2f s | %.2f× | %.2f s | %.1f MiB | %.2f s |\n' "$s" "$secs" "$(echo "$secs/$copy_secs" | bc -l)" "$cpu" "$(echo "$rss/1024" | bc -l)" "$server"
done
read -r one _ _ _ <<< "$(median larch_1)"
read -r two _ _ _ <<< "$(median larch_2)"
printf 'larch export --split 2 vs --split 1: %.2f× the speed (target >= 1.0)\n' "$(echo "$one/$two" | bc -l)"
