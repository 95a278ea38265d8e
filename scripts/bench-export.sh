#!/usr/bin/env bash
# Export benchmark (printed figures, not a timed test):
#   one-shot `larch export` of scripts/sample/events.sql (or $LARCH_EVENTS_SQL) next to
#   `COPY (SELECT row_to_json(e) FROM public.events e) TO STDOUT` in the same run, with peak RSS;
#   then a continuous export under a steady update load with --diff-interval 1s and its
#   commit-to-archive lag (p50/p99 from larch_export_commit_lag_seconds);
#   then one transaction over every row (UPDATE public.events SET amount = amount + 1) while
#   following: the exporter's RSS before it and its peak until the diff (and the compaction it
#   triggers) committed, time to archive, spill figures; and two engines following that diff (a
#   memory target, a PostgreSQL target): RSS before, peak while applying, time to apply.
#   Right after the one-shot export: its archive restored by `larch engine` into PostgreSQL next
#   to `COPY … FROM file` (LARCH_BENCH_RESTORE_ONLY=1 stops there; LARCH_BEFORE_BIN=path exports
#   and restores with another build too, alternating in the same run, and prints the ratios).
#   With it: the same export masked (hashed, faked, redacted and nulled columns) and the ratio
#   masked/unmasked (LARCH_BENCH_MASKING_ONLY=1 stops there). COPY text, the export and the
#   masked export alternate LARCH_BENCH_REPEAT times (default 5); each figure is the median.
# Usage: scripts/bench-export.sh [ROWS] [LOAD_SECONDS]   (defaults 1000000 and 30)
# LARCH_BUFFER_MEMORY (default 64Mi) is the exporter's --buffer-memory.
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
  for p in ${engine_pids:-}; do kill "$p" 2>/dev/null || true; done
  bash "$here/scripts/postgres.sh" stop "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash "$here/scripts/postgres.sh" start "$work/pg" "$port"
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=postgres
echo "loading $rows rows of events.sql ..."
psql -q -v rows="$rows" -f "${LARCH_EVENTS_SQL:-$here/scripts/sample/events.sql}" >/dev/null
# Settle the freshly loaded table before anything is timed: otherwise autovacuum's pass over the
# new rows and the checkpoint of the load land inside whichever run comes first or second.
psql -q -c "VACUUM (FREEZE, ANALYZE) public.events" -c "CHECKPOINT"
dsn="host=127.0.0.1 port=$port user=postgres dbname=postgres"

measure() { # label, command...: prints seconds and peak RSS (KiB); with $series set, keeps them
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  read -r secs rss < "$work/time"
  printf '%-44s %8.2f s   peak RSS %8.1f MiB\n' "$label" "$secs" "$(echo "$rss/1024" | bc -l)"
  echo "$secs"  > "$work/last"
  if [ -n "${series:-}" ]; then echo "$secs $rss" >> "$work/series-$series"; fi
}
median() { # series, label: the label with the median seconds of the series and its largest RSS
  local secs rss
  secs=$(sort -n "$work/series-$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  rss=$(sort -n -k2 "$work/series-$1" | tail -1 | cut -d' ' -f2)
  printf '%-44s %8.2f s   peak RSS %8.1f MiB   (median of %d runs)\n' "$2" "$secs" "$(echo "$rss/1024" | bc -l)" "$(wc -l < "$work/series-$1")"
  echo "$secs" > "$work/last"
}
measure "COPY (SELECT row_to_json(e) ...) TO STDOUT" psql -c "COPY (SELECT row_to_json(e) FROM public.events e) TO STDOUT"
copy_secs=$(cat "$work/last")

# --- Export next to COPY text, and masked (issue #18: columns hashed, faked, redacted and
# nulled, docs/masking.md). One export's time moves by a quarter from one run to the next on
# this 2-core machine, so the three alternate LARCH_BENCH_REPEAT times (default 5) and each
# figure is the median (its peak RSS the largest). LARCH_BENCH_MASKING_ONLY=1 stops after them.
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
# One untimed export first: the first 200 MB written after the load land on memory the machine
# has not handed out yet (in a VM, each new page a fault on the host), a cost of the machine,
# not of the exporter, that only the first run pays.
"$larch" export --connection "$dsn" --table events --store local --path "$work/archive-warm-up" >/dev/null 2>&1
rm -rf "$work/archive-warm-up"
for run in $(seq 1 "${LARCH_BENCH_REPEAT:-5}"); do
  rm -rf "$work/archive-next" "$work/archive-masked"
  # The first run's archive is the one restored below.
  dest="$work/archive-next"; [ "$run" = 1 ] && dest="$work/archive"
  series=copy measure "COPY public.events TO STDOUT (text), run $run" psql -c "COPY public.events TO STDOUT"
  series=export measure "larch export (one-shot, jsonl, local), run $run" "$larch" export --connection "$dsn" --table events --store local --path "$dest"
  series=masked measure "larch export (one-shot, masked), run $run" "$larch" export --connection "$dsn" --table events --store local --path "$work/archive-masked" --transform "$work/mask.yaml" --transform-key-file "$work/mask.key"
  if [ -n "${LARCH_BEFORE_BIN:-}" ]; then
    rm -rf "$work/archive-before"
    series=before measure "before: larch export (one-shot), run $run" "$LARCH_BEFORE_BIN" export --connection "$dsn" --table events --store local --path "$work/archive-before"
  fi
done
rm -rf "$work/archive-next" "$work/archive-masked" "$work/archive-before"
if [ -n "${LARCH_BEFORE_BIN:-}" ]; then
  median before "before: larch export (one-shot)"; before_export_secs=$(cat "$work/last")
fi
median copy "COPY public.events TO STDOUT (text)"; copy_text_secs=$(cat "$work/last")
median export "larch export (one-shot, jsonl, local)"; export_secs=$(cat "$work/last")
median masked "larch export (one-shot, masked)"; masked_secs=$(cat "$work/last")
printf 'ratio export/COPY row_to_json: %.2f (target <= 1.0)\n' "$(echo "$export_secs/$copy_secs" | bc -l)"
printf 'ratio export/COPY text: %.2f (target <= 1.3)\n' "$(echo "$export_secs/$copy_text_secs" | bc -l)"
printf 'ratio masked/unmasked export: %.2f (target <= 1.3)\n' "$(echo "$masked_secs/$export_secs" | bc -l)"
if [ -n "${LARCH_BEFORE_BIN:-}" ]; then
  printf 'ratio export this build/before: %.3f\n' "$(echo "$export_secs/$before_export_secs" | bc -l)"
fi
[ -n "${LARCH_BENCH_MASKING_ONLY:-}" ] && exit 0

# --- Restore (issue #16): the one-shot archive into an empty database by `larch engine` (a
# PostgreSQL target, no follow: time from start to ready, the baseline swapped in), next to
# `COPY events FROM file` into an empty copy of the table with its primary key, same run; then
# both restored tables against the source (count and md5 of every row).
mkdir -m 777 "$work/copy"   # written and read by the server's own user
psql -q -c "COPY public.events TO '$work/copy/events'"
for db in restore_copy restore_larch; do psql -q -c "CREATE DATABASE $db"; done
pg_dump --schema-only -t public.events postgres | psql -q -d restore_copy >/dev/null
measure "COPY events FROM file (empty table with its key)" psql -d restore_copy -c "COPY public.events FROM '$work/copy/events'"
restore_copy_secs=$(cat "$work/last")
# The engine's address from its log: the `larch engine listening` event's `addr` (JSON), or the
# plain `larch engine listening on ADDR` line of a binary from before that event.
listen_addr() {
  sed -n -e '/larch engine listening.*"tls":false/s/.*"addr":"\([^"]*\)".*/\1/p' \
    -e 's/^larch engine listening on \([^ ]*\)$/\1/p' "$1" | head -1
}
restore() { # label, larch binary, database: `larch engine` from start to ready, peak RSS
  echo "$dsn" | sed "s/dbname=postgres/dbname=$3/" > "$work/$3.dsn"
  cat > "$work/$3.yaml" <<YAML
sources:
  seed:
    type: archive
    store: {type: local, path: "$work/archive"}
    key_prefix: public.events/
tables:
  - source: seed
    schema: public
    table: events
    targets:
      - {type: postgres, connection_file: "$work/$3.dsn"}
YAML
  local t0 a pid secs
  t0=$(date +%s.%N)
  LARCH_LOG=warn,larch_run::engine=info LARCH_LOG_FORMAT=json "$2" engine --config "$work/$3.yaml" --listen 127.0.0.1:0 2>"$work/$3.log" &
  pid=$!; engine_pids="${engine_pids:-} $pid"
  until a=$(listen_addr "$work/$3.log") && [ -n "$a" ] \
    && curl -sf "http://$a/health/ready" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { cat "$work/$3.log" >&2; exit 1; }
    sleep 0.05
  done
  secs=$(echo "$(date +%s.%N) - $t0" | bc -l)
  printf '%-44s %8.2f s   peak RSS %8.1f MiB\n' "$1" "$secs" "$(awk '/^VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status")"
  echo "$secs" > "$work/last"
  printf 'ratio restore/COPY FROM: %.2f (target <= 1.3)\n' "$(echo "$secs/$restore_copy_secs" | bc -l)"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
# LARCH_BEFORE_BIN: another build (say main's) restored in the same run, for a before/after:
# the two alternate LARCH_BENCH_REPEAT times into fresh databases, each figure the median.
if [ -n "${LARCH_BEFORE_BIN:-}" ]; then
  for run in $(seq 1 "${LARCH_BENCH_REPEAT:-5}"); do
    for who in before after; do
      psql -q -c "CREATE DATABASE restore_${who}_$run"
      bin=$larch; [ "$who" = before ] && bin=$LARCH_BEFORE_BIN
      restore "$who: larch engine -> PostgreSQL, run $run" "$bin" "restore_${who}_$run"
      echo "$(cat "$work/last")" >> "$work/series-restore_$who"
      psql -q -c "DROP DATABASE restore_${who}_$run"
    done
  done
  b=$(sort -n "$work/series-restore_before" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  a=$(sort -n "$work/series-restore_after" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf 'restore medians: before %.2f s, this build %.2f s; ratio this build/before: %.3f\n' "$b" "$a" "$(echo "$a/$b" | bc -l)"
fi
restore "larch engine -> PostgreSQL target (to ready)" "$larch" restore_larch
table_digest() { psql -d "$1" -At -c "SELECT count(*) || ' rows, md5 ' || md5(string_agg(e::text, '|' ORDER BY id)) FROM public.events e"; }
for db in postgres restore_copy restore_larch; do printf '%-14s %s\n' "$db:" "$(table_digest $db)"; done
[ "$(table_digest postgres)" = "$(table_digest restore_larch)" ] || { echo "restored table differs from the source" >&2; exit 1; }
[ -n "${LARCH_BENCH_RESTORE_ONLY:-}" ] && exit 0

echo "continuous: --diff-interval 1s, ${load_seconds}s of single-row updates ..."
buffer_memory=${LARCH_BUFFER_MEMORY:-64Mi}
LARCH_PG_DSN=$dsn LARCH_LOG=warn "$larch" export --follow --table events --store local --path "$work/follow" \
  --diff-interval 1s --listen 127.0.0.1:0 --slot bench_follow --max-diff-fraction 0.5 \
  --buffer-memory "$buffer_memory" --spill-dir "$work/spill" 2>"$work/follow.log" &
follow_pid=$!
for _ in $(seq 1 600); do
  addr=$(sed -n 's/.*status on http:\/\/\([^)]*\)).*/\1/p' "$work/follow.log" | head -1)
  [ -n "$addr" ] && curl -sf "http://$addr/health/ready" >/dev/null 2>&1 && break
  sleep 0.5
done
echo "continuous: RSS after the baseline $(awk '/^VmRSS/ {printf "%.1f", $2/1024}' "/proc/$follow_pid/status") MiB"
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

# ---- One transaction over every row while following, and two engines following its diff. ----
rss() { awk '/^VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
hwm() { awk '/^VmHWM/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
reset_hwm() { echo 5 > "/proc/$1/clear_refs"; }   # Linux: peak RSS starts over from now
status() { curl -s "http://$addr/status"; }
field() { python3 -c "
import json, sys
try: print(json.load(sys.stdin)$1)
except Exception: print('')"; }

psql -q -c "CREATE DATABASE target" >/dev/null
echo "host=127.0.0.1 port=$port user=postgres dbname=target" > "$work/target.dsn"
engine() { # kind, extra target yaml -> starts an engine following the continuous archive
  cat > "$work/engine-$1.yaml" <<YAML
sources:
  seed:
    type: archive
    store: {type: local, path: "$work/follow"}
    key_prefix: public.events/
    follow: true
    poll_interval: 1s
tables:
  - source: seed
    schema: public
    table: events
    targets:
      - $2
YAML
  LARCH_LOG=warn,larch_run::engine=info LARCH_LOG_FORMAT=json "$larch" engine --config "$work/engine-$1.yaml" --listen 127.0.0.1:0 2>"$work/engine-$1.log" &
  engine_pids="${engine_pids:-} $!"
  eval "engine_$1_pid=$!"
}
engine memory "{type: memory, index_fields: [tenant]}"
engine postgres "{type: postgres, connection_file: \"$work/target.dsn\"}"
engine_addr() { listen_addr "$work/engine-$1.log"; }
for kind in memory postgres; do
  for _ in $(seq 1 1200); do
    a=$(engine_addr "$kind"); [ -n "$a" ] && curl -sf "http://$a/health/ready" >/dev/null 2>&1 && break
    sleep 0.5
  done
done
engine_position() { curl -s "http://$(engine_addr "$1")/status" | field "['pipelines']['seed:public.events:$1']['position']"; }
head=$(status | field "['head_position']")
for kind in memory postgres; do  # both caught up with the steady load
  until [ "$(engine_position "$kind")" = "$head" ]; do sleep 0.2; done
done
before_rss=$(rss "$follow_pid"); reset_hwm "$follow_pid"
for kind in memory postgres; do
  pid_var="engine_${kind}_pid"; eval "before_$kind=\$(rss \${$pid_var})"; reset_hwm "${!pid_var}"
done
diffs_before=$(status | field "['diffs']"); epoch_before=$(status | field "['epoch']")
echo "one transaction over all $rows rows (UPDATE public.events SET amount = amount + 1), --buffer-memory $buffer_memory ..."
t0=$(date +%s.%N)
psql -q -c "UPDATE public.events SET amount = amount + 1" >/dev/null
t1=$(date +%s.%N)
spill_peak=0
while [ "$(status | field "['diffs']")" = "$diffs_before" ]; do
  b=$(status | field "['spill_bytes']"); [ "$b" -gt "$spill_peak" ] && spill_peak=$b
  sleep 0.1
done
t2=$(date +%s.%N)
peak_diff=$(hwm "$follow_pid"); reset_hwm "$follow_pid"   # the compaction starts now
until [ "$(status | field "['epoch']")" != "$epoch_before" ]; do sleep 0.1; done
t3=$(date +%s.%N)
peak_compaction=$(hwm "$follow_pid")
s=$(status)
head=$(echo "$s" | field "['head_position']")
printf 'exporter: RSS before %s MiB; peak until the diff committed %s MiB (+%.1f MiB); peak while compacting %s MiB (+%.1f MiB)\n' \
  "$before_rss" "$peak_diff" "$(echo "$peak_diff - $before_rss" | bc -l)" \
  "$peak_compaction" "$(echo "$peak_compaction - $before_rss" | bc -l)"
printf 'exporter: COMMIT %.2f s, time to archive (COMMIT -> diff committed) %.2f s, then compaction %.2f s\n' \
  "$(echo "$t1 - $t0" | bc -l)" "$(echo "$t2 - $t1" | bc -l)" "$(echo "$t3 - $t2" | bc -l)"
printf 'exporter: spilled runs %s, spill peak %.1f MiB on disk, diff %s\n' \
  "$(echo "$s" | field "['spilled_runs_total']")" "$(echo "$spill_peak/1048576" | bc -l)" \
  "$(ls -l "$work"/follow/public.events/epoch=*/diff-* | sort -k5 -n | tail -1 | awk '{printf "%.1f MiB", $5/1048576}')"
for kind in memory postgres; do
  pid_var="engine_${kind}_pid"; before_var="before_$kind"
  until [ "$(engine_position "$kind")" = "$head" ]; do sleep 0.2; done
  t4=$(date +%s.%N)
  printf 'engine (%s target): RSS before %s MiB, peak while following the diff %s MiB (+%.1f MiB), applied %.2f s after the diff\n' \
    "$kind" "${!before_var}" "$(hwm "${!pid_var}")" "$(echo "$(hwm "${!pid_var}") - ${!before_var}" | bc -l)" \
    "$(echo "$t4 - $t2" | bc -l)"
done
digest() { psql -d "$1" -At -c "SELECT count(*) || ' rows, md5 ' || md5(string_agg(e::text, ',' ORDER BY id)) FROM public.events e"; }
source_digest=$(digest postgres); target_digest=$(digest target)
echo "source table:           $source_digest"
echo "engine PostgreSQL copy: $target_digest"
[ "$source_digest" = "$target_digest" ] && echo "the archive, applied by the engine, equals the table (exact comparison)" \
  || { echo "MISMATCH between the table and the engine's copy of the archive" >&2; exit 1; }
kill -TERM "$follow_pid"; wait "$follow_pid" || true; follow_pid=


# --- Schema-change epoch (issue #13): under the same update load, a fresh `--follow` export, then
# two DDLs; for each, the time from its commit to the new epoch committed (the exporter's /status
# epoch), next to the one-shot export above, and the exporter's peak RSS during it (VmHWM, reset
# before each DDL). ADD COLUMN ... DEFAULT 7 writes nothing to WAL; ALTER COLUMN ... TYPE rewrites.
echo "schema-change epoch: a fresh --follow export under 200 updates/s, then two DDLs ..."
LARCH_PG_DSN=$dsn LARCH_LOG=info "$larch" export --follow --table events --store local --path "$work/schema" \
  --diff-interval 1s --listen 127.0.0.1:0 --slot bench_schema 2>"$work/schema.log" &
schema_pid=$!
schema_load_pid=
trap '{ [ -n "$schema_load_pid" ] && kill "$schema_load_pid"; kill "$schema_pid"; } 2>/dev/null || true; cleanup' EXIT
schema_addr=
for _ in $(seq 1 1200); do
  schema_addr=$(sed -n 's/.*status on http:\/\/\([^)]*\)).*/\1/p' "$work/schema.log" | head -1)
  [ -n "$schema_addr" ] && curl -sf "http://$schema_addr/health/ready" >/dev/null 2>&1 && break
  sleep 0.5
done
[ -n "$schema_addr" ] || { cat "$work/schema.log" >&2; exit 1; }
pgbench -n -c 2 -T 3600 -R 200 -D rows="$rows" -f "$work/update.sql" postgres >/dev/null 2>&1 &
schema_load_pid=$!
sleep 2
python3 - "$schema_addr" "$schema_pid" "$export_secs" <<'PY'
import json, subprocess, sys, time, urllib.request
addr, pid, export_secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
def epoch():
    with urllib.request.urlopen(f"http://{addr}/status") as r:
        return json.load(r)["epoch"]
def hwm_mib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
for ddl in ["ALTER TABLE public.events ADD COLUMN extra int4 DEFAULT 7",
            "ALTER TABLE public.events ALTER COLUMN amount TYPE numeric(14,4)"]:
    before = epoch()
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS: the peak below is this epoch's
    t0 = time.monotonic()
    subprocess.run(["psql", "-q", "-c", ddl], check=True)
    committed = time.monotonic()
    while epoch() == before:
        time.sleep(0.05)
    secs = time.monotonic() - committed
    print(f"{ddl}\n  DDL itself {committed - t0:6.2f} s; DDL commit -> epoch {before + 1} committed "
          f"{secs:6.2f} s (ratio to the one-shot export {secs / export_secs:.2f}); "
          f"exporter peak RSS {hwm_mib():.1f} MiB")
PY
kill "$schema_load_pid" 2>/dev/null || true; wait "$schema_load_pid" 2>/dev/null || true; schema_load_pid=
echo "of which, the exporter's own account (from seeing the change to the new epoch committed):"
grep 'schema change: new epoch committed' "$work/schema.log" | grep -o '"seconds":[0-9.]*' | sed 's/^/  /' || true
kill -TERM "$schema_pid"; wait "$schema_pid" || true
