#!/usr/bin/env bash
# Smoke test of the fake kubelet against the real local control plane (e2e/cluster.sh):
#   control plane up -> larch-fake-kubelet (images `sh` -> /bin/sh, `python` -> python3) ->
#   Node Ready -> a Job whose container writes a termination message completes with it (and
#   `kubectl logs` shows its output) ->
#   a Deployment served by `python3 -m http.server --bind $(POD_IP) 8080` behind an httpGet
#   readinessProbe becomes Available -> deleting it removes its pods and kills their processes ->
#   a kube-rs in-cluster client (examples/in_cluster.rs, `Config::infer()`) authenticates as the
#   pod's service account -> fake kubelet stopped -> control plane down.
#
# usage: e2e/fake-kubelet/smoke.sh [DIR]     (default: a temporary directory)
# env:   LARCH_E2E_CLUSTER_SH  cluster.sh to use (default: ../cluster.sh next to this directory,
#                              else /work/wt/e2e/e2e/cluster.sh)
#        LARCH_FAKE_KUBELET    prebuilt binary (default: cargo build into $CARGO_TARGET_DIR,
#                              default /work/target-kubelet)
#        LARCH_FAKE_KUBELET_IN_CLUSTER  prebuilt examples/in_cluster (default: built with the
#                              kubelet; the in-cluster check is skipped if a prebuilt kubelet
#                              is given without it)
#        LARCH_CACHE           binaries (kubectl) from $LARCH_CACHE/bin (default ~/.cache/larch)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
LARCH_CACHE="${LARCH_CACHE:-$HOME/.cache/larch}"
BIN="$LARCH_CACHE/bin"
DIR="${1:-$(mktemp -d /tmp/larch-fk-smoke.XXXXXX)}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"

CLUSTER_SH="${LARCH_E2E_CLUSTER_SH:-}"
if [[ -z "$CLUSTER_SH" ]]; then
  if [[ -x "$here/../cluster.sh" ]]; then CLUSTER_SH="$here/../cluster.sh"; else CLUSTER_SH=/work/wt/e2e/e2e/cluster.sh; fi
fi
[[ -x "$CLUSTER_SH" ]] || { echo "smoke: no cluster.sh at $CLUSTER_SH" >&2; exit 1; }

if [[ -z "${LARCH_FAKE_KUBELET:-}" ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/target-kubelet}"
  cargo build --quiet --manifest-path "$here/Cargo.toml" --bin larch-fake-kubelet --example in_cluster
  LARCH_FAKE_KUBELET="$CARGO_TARGET_DIR/debug/larch-fake-kubelet"
  LARCH_FAKE_KUBELET_IN_CLUSTER="$CARGO_TARGET_DIR/debug/examples/in_cluster"
fi
IN_CLUSTER="${LARCH_FAKE_KUBELET_IN_CLUSTER:-}"
# a real interpreter, not a pyenv shim (the pod's environment has no pyenv)
PYTHON=/usr/bin/python3
[[ -x "$PYTHON" ]] || PYTHON="$(python3 -c 'import sys; print(sys.executable)')"

KUBELET_PID=
cleanup() {
  local rc=$?
  if [[ -n "$KUBELET_PID" ]] && kill -0 "$KUBELET_PID" 2>/dev/null; then
    kill -TERM "$KUBELET_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$KUBELET_PID" 2>/dev/null || break; sleep 0.2; done
  fi
  if ((rc != 0)) && [[ -f "$DIR/fake-kubelet.log" ]]; then
    echo "----- last lines of $DIR/fake-kubelet.log" >&2
    tail -n 40 "$DIR/fake-kubelet.log" >&2
  fi
  "$CLUSTER_SH" down "$DIR/cluster" || true
  if ((rc == 0)); then rm -rf "$DIR"; else echo "smoke: kept $DIR" >&2; fi
  exit $rc
}
trap cleanup EXIT

"$CLUSTER_SH" up "$DIR/cluster"
export KUBECONFIG="$DIR/cluster/kubeconfig"
k() { "$BIN/kubectl" "$@"; }

pass() { echo "ok: $*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
# wait_until SECONDS DESCRIPTION COMMAND...
wait_until() {
  local secs="$1" what="$2"; shift 2
  local t0=$SECONDS
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < secs)) || fail "$what (after ${secs}s)"
    sleep 0.5
  done
  pass "$what ($((SECONDS - t0))s)"
}

"$LARCH_FAKE_KUBELET" --kubeconfig "$KUBECONFIG" --data-dir "$DIR/kubelet" \
  --binary sh=/bin/sh --binary "python=$PYTHON" ${IN_CLUSTER:+--binary "in-cluster=$IN_CLUSTER"} \
  > "$DIR/fake-kubelet.log" 2>&1 &
KUBELET_PID=$!
wait_until 30 "node larch-node Ready" k wait --for=condition=Ready node/larch-node --timeout=1s
wait_until 30 "node lease renewed" k -n kube-node-lease get lease larch-node

# ---- Job: exit 0 with a termination message
k apply -f - <<'YAML'
apiVersion: batch/v1
kind: Job
metadata: {name: smoke-msg, namespace: default}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      securityContext: {runAsUser: 65532, runAsGroup: 65532, fsGroup: 65532}
      containers:
      - name: main
        image: registry.example/tools/sh:1
        command: ["sh", "-c", "echo log line from $(POD_NAME); echo \"done by $(POD_NAME) on $(POD_IP) as $(id -u)\" > /dev/termination-log"]
        env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
YAML
wait_until 60 "Job smoke-msg Complete" k wait --for=condition=Complete job/smoke-msg --timeout=1s
pod="$(k get pods -l batch.kubernetes.io/job-name=smoke-msg -o jsonpath='{.items[0].metadata.name}')"
msg="$(k get pod "$pod" -o jsonpath='{.status.containerStatuses[0].state.terminated.message}')"
ip="$(k get pod "$pod" -o jsonpath='{.status.podIP}')"
[[ "$msg" == "done by $pod on $ip as 65532"* ]] || fail "termination message: got '$msg'"
pass "termination message '${msg%$'\n'}'"
[[ "$ip" == 127.* && "$ip" != 127.0.0.1 ]] || fail "pod IP $ip is not a 127.N.X.Y address"
logs="$(k logs "$pod")"
[[ "$logs" == "log line from $pod" ]] || fail "kubectl logs: got '$logs'"
pass "kubectl logs '$logs'"

# ---- Deployment behind an httpGet readiness probe, bound to the pod IP
k apply -f - <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: smoke-web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: smoke-web}}
  template:
    metadata: {labels: {app: smoke-web}}
    spec:
      securityContext: {runAsUser: 65532, runAsGroup: 65532}
      containers:
      - name: web
        image: docker.io/library/python:3.11-slim
        command: ["python3", "-m", "http.server", "--bind", "$(POD_IP)", "--directory", "/srv", "8080"]
        env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
        volumeMounts: [{name: srv, mountPath: /srv}]
      volumes: [{name: srv, emptyDir: {}}]
YAML
wait_until 90 "Deployment smoke-web Available" k wait --for=condition=Available deploy/smoke-web --timeout=1s
ready="$(k get deploy smoke-web -o jsonpath='{.status.readyReplicas}')"
[[ "$ready" == 2 ]] || fail "readyReplicas=$ready"
ips="$(k get pods -l app=smoke-web -o jsonpath='{.items[*].status.podIP}')"
for ip in $ips; do
  curl -fsS --max-time 5 "http://$ip:8080/" > /dev/null || fail "GET http://$ip:8080/"
done
pass "both replicas answer on their own pod IP ($ips)"
procs() { for ip in $ips; do pgrep -f "http.server --bind $ip " || true; done; }
[[ -n "$(procs)" ]] || fail "no http.server process found"

k delete deploy smoke-web --wait=true
none_left() { [[ -z "$(k get pods -l app=smoke-web -o name)" ]]; }
wait_until 30 "pods of smoke-web deleted" none_left
no_procs() { [[ -z "$(procs)" ]]; }
wait_until 15 "http.server processes gone" no_procs

# ---- an in-cluster kube-rs client authenticates with the mounted service-account token
if [[ -n "$IN_CLUSTER" ]]; then
  k apply -f - <<'YAML'
apiVersion: batch/v1
kind: Job
metadata: {name: smoke-in-cluster, namespace: default}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      securityContext: {runAsUser: 65532, runAsGroup: 65532}
      containers: [{name: main, image: ghcr.io/example/in-cluster:dev}]
YAML
  wait_until 60 "Job smoke-in-cluster Complete" k wait --for=condition=Complete job/smoke-in-cluster --timeout=1s
  msg="$(k get pods -l batch.kubernetes.io/job-name=smoke-in-cluster \
    -o jsonpath='{.items[0].status.containerStatuses[0].state.terminated.message}')"
  [[ "$msg" == "in-cluster client is system:serviceaccount:default:default" ]] || fail "in-cluster: got '$msg'"
  pass "kube-rs Config::infer() inside a pod: '$msg'"
else
  echo "skip: in-cluster client check (no LARCH_FAKE_KUBELET_IN_CLUSTER)"
fi

# ---- the kubelet stops cleanly
kill -TERM "$KUBELET_PID"
for _ in $(seq 1 100); do kill -0 "$KUBELET_PID" 2>/dev/null || break; sleep 0.2; done
kill -0 "$KUBELET_PID" 2>/dev/null && fail "fake kubelet still running 20s after SIGTERM"
KUBELET_PID=
pass "fake kubelet stopped"
echo "smoke: all checks passed"
