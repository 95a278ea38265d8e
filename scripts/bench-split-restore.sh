#!/usr/bin/env bash
# Split restore benchmark (printed figures, not a timed test): one archive of
# scripts/sample/events.sql (or $LARCH_EVENTS_SQL) restored into empty databases by
#   `COPY events FROM file` into the table with its key (the baseline),
#   `pg_restore -j N` of a directory-format `pg_dump` (N = 1, 2, 4),
#   `larch restore --split N` (N = 1, 2, 4),
# in the same run, alternating LARCH_BENCH_REPEAT times (default 3; each figure the median):
# wall time, the client's CPU seconds and peak RSS, and the server's CPU seconds (its backends'
# user+system time, read from the postmaster's children's time when they exit). Every restored
# table is checked against the source (count and md5 of every row).
# Usage: scripts/bench-split-restore.sh [ROWS...]   (default 1000000; e.g. 1000000 5000000)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# Several sizes in one run: each size is a run of its own (its own database and table).
if [ $# -gt 1 ]; then for n in "$@"; do bash "$0" "$n"; done; exit 0; fi
rows=${1:-1000000}
work=$(mktemp -d); chmod 755 "$work"
port=${LARCH_BENCH_PG_PORT:-55434}
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
digest() { psql -d "$1" -At -c "SELECT count(*) || ' ' || md5(string_agg(e::text, '|' ORDER BY id)) FROM public.events e"; }
source_digest=$(digest postgres)

"$larch" export --connection "$dsn" --table events --store local --path "$work/archive" >/dev/null 2>&1
mkdir "$work/copy" && chown postgres "$work/copy"
psql -q -c "COPY public.events TO '$work/copy/events'"
pg_dump -Fd -j 2 -t public.events -f "$work/dump" postgres
pg_dump --schema-only -t public.events postgres > "$work/schema.sql"

run() { # series, database, command...: wall, client CPU, client RSS, server CPU into the series
  local series=$1 db=$2; shift 2
  psql -q -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
  [ "$series" = copy ] && psql -q -d "$db" -f "$work/schema.sql" >/dev/null
  psql -q -c CHECKPOINT
  local before after
  before=$(server_cpu)
  /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  # A backend's time reaches the postmaster's children's time when it exits, after its client.
  until [ "$(psql -At -c "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db'")" = 0 ]; do sleep 0.05; done
  sleep 0.2
  after=$(server_cpu)
  read -r secs user sys rss < "$work/time"
  [ "$(digest "$db")" = "$source_digest" ] || { echo "$series: the restored table differs from the source" >&2; exit 1; }
  echo "$secs $(echo "$user + $sys" | bc -l) $rss $(echo "$after - $before" | bc -l)" >> "$work/series-$series"
  psql -q -c "DROP DATABASE $db"
}

for r in $(seq 1 "${LARCH_BENCH_REPEAT:-3}"); do
  echo "run $r ..."
  run copy bench_copy psql -d bench_copy -c "COPY public.events FROM '$work/copy/events'"
  for n in 1 2 4; do
    run "pg_restore_$n" "bench_pgr_$n" pg_restore -j "$n" -d "bench_pgr_$n" "$work/dump"
    run "larch_$n" "bench_larch_$n" "$larch" restore --connection "host=127.0.0.1 port=$port user=postgres dbname=bench_larch_$n" \
      --store local --path "$work/archive" --table events --split "$n"
  done
done

median() { sort -n "$work/series-$1" | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'; }
read -r copy_secs _ _ _ <<< "$(median copy)"
printf '\n%d rows, medians of %s runs (machine: %s cores)\n' "$rows" "${LARCH_BENCH_REPEAT:-3}" "$(nproc)"
printf '| restore | wall | vs COPY FROM | client CPU | client peak RSS | server CPU |\n|---|---|---|---|---|---|\n'
for s in copy pg_restore_1 pg_restore_2 pg_restore_4 larch_1 larch_2 larch_4; do
  read -r secs cpu rss server <<< "$(median "$s")"
  printf '| %s | %.2f s | %.2f× | %.2f s | %.1f MiB | %.2f s |\n' "$s" "$secs" "$(echo "$secs/$copy_secs" | bc -l)" "$cpu" "$(echo "$rss/1024" | bc -l)" "$server"
done
read -r one _ _ _ <<< "$(median larch_1)"
read -r two _ _ _ <<< "$(median larch_2)"
printf 'larch restore --split 2 vs --split 1: %.2f× faster (target >= 1.3)\n' "$(echo "$one/$two" | bc -l)"
