#!/usr/bin/env bash
# Smoke check of the local control plane: up -> kubectl get ns -> a Deployment gets its ReplicaSet
# and Pod objects -> a Job gets its Pod object -> a restricted namespace rejects a privileged pod
# -> helm version -> down. Pods stay Pending (no kubelet): that is expected here.
#
# usage: e2e/smoke.sh [DIR]      (default: a temporary directory)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
LARCH_CACHE="${LARCH_CACHE:-$HOME/.cache/larch}"
BIN="$LARCH_CACHE/bin"
DIR="${1:-$(mktemp -d /tmp/larch-e2e-smoke.XXXXXX)}"

"$here/build.sh"
trap '"$here/cluster.sh" down "$DIR"' EXIT
"$here/cluster.sh" up "$DIR"
eval "$("$here/cluster.sh" env "$DIR")"
k() { "$BIN/larch-cp" kubectl "$@"; }

# wait_until DESCRIPTION COMMAND...  (60 s)
wait_until() {
  local what="$1"; shift
  for _ in $(seq 1 300); do
    if "$@" >/dev/null 2>&1; then echo "ok: $what"; return 0; fi
    sleep 0.2
  done
  echo "FAILED: $what" >&2
  return 1
}
nonempty() { [[ -n "$("$@")" ]]; }

k version
k get ns

k apply -f - <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: smoke, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: smoke}}
  template:
    metadata: {labels: {app: smoke}}
    spec:
      containers: [{name: c, image: example.invalid/smoke:1}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: smoke, namespace: default}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: example.invalid/smoke:1, command: ["true"]}]
EOF
wait_until "ReplicaSet of Deployment smoke" nonempty k get rs -l app=smoke -o name
wait_until "2 Pods of Deployment smoke" \
  bash -c "[[ \$('$BIN/larch-cp' kubectl get pods -l app=smoke -o name | wc -l) == 2 ]]"
wait_until "Pod of Job smoke" nonempty k get pods -l batch.kubernetes.io/job-name=smoke -o name
k get deploy,rs,job,pods -o wide

# PodSecurity admission is on: a restricted namespace must reject a non-compliant pod
k create namespace smoke-restricted
k label namespace smoke-restricted pod-security.kubernetes.io/enforce=restricted
wait_until "ServiceAccount smoke-restricted/default" k -n smoke-restricted get sa default
if out="$(k -n smoke-restricted run bad --image=example.invalid/x:1 --restart=Never 2>&1)"; then
  echo "FAILED: privileged-by-default pod was admitted into a restricted namespace: $out" >&2
  exit 1
fi
if ! grep -q 'violates PodSecurity "restricted' <<< "$out"; then
  echo "FAILED: pod rejected for another reason than PodSecurity: $out" >&2
  exit 1
fi
echo "ok: PodSecurity rejects: ${out:0:120}..."

"$BIN/helm" version
"$BIN/helm" list -A

"$here/cluster.sh" status "$DIR"
echo "smoke: all checks passed"
