#!/usr/bin/env bash
# The operator at fleet scale, on the real control plane of e2e/env.sh: an ArchiveSourceSet over
# N labelled namespaces, seeded from a one-shot archive of a tiny public.events, one in-memory
# engine per namespace. For each N it prints
#   - the time from applying the set until every namespace is ready (set status readyNamespaces),
#     and the write requests the API server served meanwhile;
#   - the operator's peak RSS (VmHWM) and CPU (rollout, and steady state);
#   - write requests per minute in steady state by resource and verb, from the API server's own
#     apiserver_request_total (all clients: the operator, the fake kubelet's node Lease renewals,
#     KCM), and the operator's own larch_operator_api_writes_total / reconciles_total.
#
#   e2e/bench-fleet.sh N [N...]          e.g. e2e/bench-fleet.sh 30 100
#
# One fresh environment per N, torn down afterwards. Environment:
#   LARCH_BIN           larch binary of the operator and its pods (default
#                       $CARGO_TARGET_DIR/debug/larch); build it first
#   LARCH_FAKE_KUBELET  fake kubelet binary (default $CARGO_TARGET_DIR/debug/larch-fake-kubelet)
#   LARCH_CHART         the helm chart to install (default charts/larch of this checkout; point
#                       it at another checkout to measure that version with its own CRDs)
#   LARCH_BENCH_SETTLE  seconds between "all ready" and the steady-state window (default 30)
#   LARCH_BENCH_STEADY  seconds of the steady-state window (default 60)
#   LARCH_BENCH_DIR     where environments live (default /var/tmp/larch-bench-fleet)
# Needs the e2e binaries of e2e/build.sh under $LARCH_CACHE/bin.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export LARCH_CACHE=${LARCH_CACHE:-$HOME/.cache/larch}
target=${CARGO_TARGET_DIR:-$here/target}
export LARCH_BIN=${LARCH_BIN:-$target/debug/larch}
export LARCH_FAKE_KUBELET=${LARCH_FAKE_KUBELET:-$target/debug/larch-fake-kubelet}
chart=${LARCH_CHART:-$here/charts/larch}
settle=${LARCH_BENCH_SETTLE:-30}
steady=${LARCH_BENCH_STEADY:-60}
base=${LARCH_BENCH_DIR:-/var/tmp/larch-bench-fleet}
export LARCH_SAMPLE_ROWS=${LARCH_SAMPLE_ROWS:-100}

die() { echo "bench-fleet: $*" >&2; exit 1; }
log() { echo "bench-fleet: $*" >&2; }
[ $# -ge 1 ] || die "usage: $0 N [N...]"
[ -x "$LARCH_BIN" ] || die "LARCH_BIN=$LARCH_BIN is not an executable (cargo build --bin larch)"
[ -x "$LARCH_FAKE_KUBELET" ] || die "LARCH_FAKE_KUBELET=$LARCH_FAKE_KUBELET is not an executable"
[ -d "$chart" ] || die "LARCH_CHART=$chart is not a chart directory"

# Write requests per minute between two apiserver_request_total scrapes, by resource/verb.
write_rates() { # before after seconds
  python3 - "$1" "$2" "$3" <<'EOF'
import re, sys
def load(p):
    out = {}
    for line in open(p):
        m = re.match(r'^apiserver_request_total\{(.*)\} (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("verb") not in ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"):
            continue
        res = labels.get("resource", "")
        if labels.get("subresource"):
            res += "/" + labels["subresource"]
        key = (res, labels["verb"])
        out[key] = out.get(key, 0.0) + float(m.group(2))
    return out
a, b, secs = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
rows = sorted(((k, b[k] - a.get(k, 0.0)) for k in b if b[k] - a.get(k, 0.0) > 0), key=lambda r: -r[1])
total = sum(d for _, d in rows)
print(f"  {'resource':<40} {'verb':<8} {'requests':>9} {'per minute':>11}")
for (res, verb), d in rows:
    print(f"  {res:<40} {verb:<8} {d:>9.0f} {d * 60 / secs:>11.1f}")
lease = sum(d for (res, _), d in rows if res == "leases")
print(f"  {'total':<40} {'':<8} {total:>9.0f} {total * 60 / secs:>11.1f}   (without leases: {(total - lease) * 60 / secs:.1f}/min)")
EOF
}

# The operator's own counters between two scrapes of its /metrics, per minute.
operator_rates() { # before after seconds
  python3 - "$1" "$2" "$3" <<'EOF'
import re, sys
def load(p):
    out = {}
    for line in open(p):
        m = re.match(r'^(larch_operator_(?:api_writes|applies_unchanged|reconciles)_total)\{(.*)\} (\S+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out
a, b, secs = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
for k in sorted(b):
    d = b[k] - a.get(k, 0.0)
    if d > 0:
        print(f"  {k[0]}{{{k[1]}}}: {d:.0f} ({d * 60 / secs:.1f}/min)")
if "larch_operator_api_writes_total" in open(sys.argv[2]).read():
    w = sum(b[k] - a.get(k, 0.0) for k in b if k[0] == "larch_operator_api_writes_total")
    print(f"  => the operator's write requests: {w:.0f} ({w * 60 / secs:.1f}/min)")
else:
    print("  => this version does not count its write requests (no larch_operator_api_writes_total)")
EOF
}

# Who wrote the Events of a window: Events created or updated since $1 (RFC 3339), by reporting
# component, reason and kind of the object.
event_sources() { # since
  "$KUBECTL" get events.events.k8s.io -A -o json | python3 -c '
import json, sys
since = sys.argv[1]
out = {}
for e in json.load(sys.stdin)["items"]:
    seen = (e.get("series") or {}).get("lastObservedTime") or e.get("deprecatedLastTimestamp") or e.get("eventTime") or ""
    if seen[:19] < since[:19]:
        continue
    who = e.get("reportingController") or (e.get("deprecatedSource") or {}).get("component") or "?"
    key = (who, e.get("reason", ""), (e.get("regarding") or {}).get("kind", ""))
    out[key] = out.get(key, 0) + 1
for (who, reason, kind), n in sorted(out.items(), key=lambda r: -r[1])[:8]:
    print(f"  {who:<36} {reason:<24} {kind:<12} {n} event(s)")
' "$1"
}

proc_cpu() { # pid -> CPU seconds (user + system)
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}

bench() {
  local n=$1 dir="$base-$1"
  [ ! -e "$dir" ] || bash "$here/e2e/env.sh" down "$dir" >/dev/null 2>&1 || true
  log "N=$n: environment in $dir"
  bash "$here/e2e/env.sh" up "$dir" >/dev/null 2>"$dir.up.log" || { cat "$dir.up.log" >&2; die "env.sh up failed"; }
  trap "bash '$here/e2e/env.sh' down '$dir' >/dev/null 2>&1 || true" EXIT
  # shellcheck disable=SC1091
  . "$dir/env"
  k() { "$KUBECTL" "$@"; }

  "$HELM" install larch "$chart" --namespace larch-system --create-namespace \
    --set image.repository=larch.local/larch --set image.tag=bench --wait --timeout 300s >/dev/null
  local op_pod op_ip op_pid
  op_pod=$(k get pods -n larch-system -o jsonpath='{.items[0].metadata.name}')
  op_ip=$(k get pod -n larch-system "$op_pod" -o jsonpath='{.status.podIP}')
  op_pid=$(k get pod -n larch-system "$op_pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
  op_pid=${op_pid#fake://}
  tr '\0' ' ' <"/proc/$op_pid/cmdline" | grep -q operator || die "pid $op_pid is not the operator"

  # The seed: a one-shot export of the sample table, made in the platform namespace.
  curl -sS -o /dev/null -X PUT "$LARCH_E2E_S3_ENDPOINT/seeds"
  k apply --server-side -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: platform}
---
apiVersion: v1
kind: Secret
metadata: {name: pg-source, namespace: platform}
stringData: {dsn: "$LARCH_E2E_PG_DSN"}
---
apiVersion: v1
kind: Secret
metadata: {name: s3-credentials, namespace: platform}
stringData: {AWS_ACCESS_KEY_ID: bench, AWS_SECRET_ACCESS_KEY: bench-secret}
---
apiVersion: v1
kind: Secret
metadata: {name: seed-reader, namespace: platform}
stringData: {AWS_ACCESS_KEY_ID: reader, AWS_SECRET_ACCESS_KEY: reader-secret}
---
apiVersion: larch.dev/v1alpha1
kind: ArchiveExport
metadata: {name: seed, namespace: platform}
spec:
  mode: OneShot
  source:
    connectionSecretRef: {name: pg-source, key: dsn}
    table: {schema: public, name: events}
  destination:
    s3:
      bucket: seeds
      region: us-east-1
      endpoint: $LARCH_E2E_S3_ENDPOINT
      pathStyle: true
      credentials: {secretRef: {name: s3-credentials}}
EOF
  k wait -n platform --for=condition=LastExportSucceeded archiveexport/seed --timeout=300s >/dev/null
  local prefix
  prefix=$(k get archiveexport -n platform seed -o jsonpath='{.status.lastExport.keyPrefix}')
  for i in $(seq -w 1 "$n"); do
    printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: dev-%s, labels: {larch.dev/bench: fleet}}\n---\n' "$i"
  done | k apply --server-side -f - >/dev/null

  local t0 cpu0 ready=0 m0="$dir/apiserver.0" m1="$dir/apiserver.1" m2="$dir/apiserver.2" m3="$dir/apiserver.3"
  k get --raw /metrics >"$m0"
  cpu0=$(proc_cpu "$op_pid")
  t0=$(date +%s.%N)
  k apply --server-side -f - >/dev/null <<EOF
apiVersion: larch.dev/v1alpha1
kind: ArchiveSourceSet
metadata: {name: fleet}
spec:
  namespaceSelector:
    matchLabels: {larch.dev/bench: fleet}
  credentials:
    secretRef: {namespace: platform, name: seed-reader}
    shareToNamespaces: true
  template:
    spec:
      archive:
        s3:
          bucket: seeds
          region: us-east-1
          endpoint: $LARCH_E2E_S3_ENDPOINT
          pathStyle: true
        keyPrefix: $prefix
      table: {schema: public, name: events}
      follow: true
      pollInterval: 30s
      target:
        memory: {}
EOF
  local deadline=$((SECONDS + 60 + 12 * n))
  until [ "$ready" = "$n" ]; do
    ((SECONDS < deadline)) || { k get archivesourceset fleet -o yaml >&2; die "N=$n: not every namespace ready after $((12 * n + 60))s"; }
    sleep 1
    ready=$(k get archivesourceset fleet -o jsonpath='{.status.readyNamespaces}' 2>/dev/null || true)
  done
  local t1 cpu1
  t1=$(date +%s.%N)
  cpu1=$(proc_cpu "$op_pid")
  k get --raw /metrics >"$m1"
  local rollout
  rollout=$(python3 -c "print(f'{$t1 - $t0:.1f}')")

  sleep "$settle"
  local cpu2 cpu3 o2="$dir/operator.2" o3="$dir/operator.3" since
  since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  k get --raw /metrics >"$m2"
  curl -fsS "http://$op_ip:8080/metrics" >"$o2"
  cpu2=$(proc_cpu "$op_pid")
  sleep "$steady"
  k get --raw /metrics >"$m3"
  curl -fsS "http://$op_ip:8080/metrics" >"$o3"
  cpu3=$(proc_cpu "$op_pid")

  echo
  echo "== N=$n namespaces (operator $LARCH_BIN, chart $chart)"
  echo "every namespace ready ${rollout}s after the set was applied"
  echo "operator: peak RSS $(awk '/VmHWM/ {printf "%.1f MiB", $2 / 1024}' "/proc/$op_pid/status")," \
    "CPU $(python3 -c "print(f'{$cpu1 - $cpu0:.2f}')") s during the rollout," \
    "$(python3 -c "print(f'{($cpu3 - $cpu2) * 100 / $steady:.2f}')")% of a core in steady state"
  echo "write requests during the rollout (apiserver_request_total, all clients):"
  write_rates "$m0" "$m1" "$(python3 -c "print($t1 - $t0)")"
  echo "write requests in ${steady}s of steady state, ${settle}s after all were ready (apiserver_request_total, all clients):"
  write_rates "$m2" "$m3" "$steady"
  echo "Events written in that window, by reporter, reason and object kind:"
  event_sources "$since"
  echo "the operator's own counters over the same ${steady}s:"
  operator_rates "$o2" "$o3" "$steady"
  bash "$here/e2e/env.sh" down "$dir" >/dev/null 2>&1 || true
  trap - EXIT
}

for n in "$@"; do
  bench "$n"
done
