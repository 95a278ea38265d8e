#!/usr/bin/env bash
# Issue #16's throughput table in one run (printed figures, not a timed test), each larch
# figure next to its baseline measured in the same run:
#   restore into PostgreSQL (`larch engine`, postgres target)  vs  COPY events FROM file
#   one-shot export to local JSONL                             vs  COPY events TO STDOUT (text)
#   engine baseline into the memory target (peak RSS)          vs  the folded state as JSON
# The first two come from scripts/bench-export.sh (LARCH_BENCH_RESTORE_ONLY=1), the third from
# the bench_engine example (its reconstruct phase measures the folded JSON).
# Usage: scripts/bench-throughput.sh [ROWS]   (default 1000000)
#   needs `cargo build --release --bin larch --example bench_engine` first.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rows=${1:-1000000}
release=${CARGO_TARGET_DIR:-$here/target}/release
export LARCH_BIN=${LARCH_BIN:-$release/larch}
bench_engine=${LARCH_BENCH_ENGINE_BIN:-$release/examples/bench_engine}
for b in "$LARCH_BIN" "$bench_engine"; do
  [ -x "$b" ] || { echo "missing $b: cargo build --release --bin larch --example bench_engine" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "load average at the start: $(load)"
LARCH_BENCH_RESTORE_ONLY=1 bash "$here/scripts/bench-export.sh" "$rows" | tee "$work/export.txt"
echo "load average after export and restore: $(load)"
# Three follow samples: the engine's follow latency is not part of this table.
"$bench_engine" "$rows" 3 | tee "$work/engine.txt"
echo "load average at the end: $(load)"
python3 - "$work" "$rows" <<'PY'
import re, sys
work, rows = sys.argv[1], int(sys.argv[2])
text = open(f"{work}/export.txt").read() + open(f"{work}/engine.txt").read()
def timed(label):
    m = re.search(re.escape(label) + r"[\s:]+([\d.]+) s\s+peak RSS\s+([\d.]+) MiB", text)
    if not m:
        sys.exit(f"no figure for {label!r} in the benchmark output")
    return float(m.group(1)), float(m.group(2))
copy_from = timed("COPY events FROM file (empty table with its key)")
restore = timed("larch engine -> PostgreSQL target (to ready)")
copy_to = timed("COPY public.events TO STDOUT (text)")
export = timed("larch export (one-shot, jsonl, local)")
engine = timed("engine baseline → memory")
m = re.search(r"folded state as JSON \(([\d.]+) MiB\)", text)
folded = float(m.group(1))
print(f"\n{rows} rows of events.sql; ratio = larch / the baseline of the same run")
print("| work | larch | baseline (same run) | ratio | target |")
print("|---|---|---|---|---|")
print(f"| restore into PostgreSQL (`larch engine`, postgres target, to ready) | {restore[0]:.2f} s, {restore[1]:.1f} MiB "
      f"| `COPY events FROM file` (empty table with its key) {copy_from[0]:.2f} s | {restore[0] / copy_from[0]:.2f}× | ≤ 1.3× |")
print(f"| one-shot export to local JSONL | {export[0]:.2f} s, {export[1]:.1f} MiB "
      f"| `COPY events TO STDOUT` (text) {copy_to[0]:.2f} s | {export[0] / copy_to[0]:.2f}× | ≤ 1.3×, RSS ≤ 64 MiB |")
print(f"| engine baseline into the memory target | {engine[0]:.2f} s, {engine[1]:.1f} MiB peak "
      f"| folded state as JSON {folded:.1f} MiB | {engine[1] / folded:.2f}× RSS | ≤ 1.2× RSS |")
PY
