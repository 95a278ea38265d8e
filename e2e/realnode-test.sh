#!/usr/bin/env bash
# The scenarios on the real node (e2e/realnode.sh): the larch image run by a real kubelet through
# containerd + runc, the operator installed by `helm install`, every namespace enforcing Pod
# Security "restricted".
#
#   e2e/realnode-test.sh            up, scenarios, down (always; logs copied to
#                                   $LARCH_CACHE/realnode-logs on a failure)
#   e2e/realnode-test.sh --keep     leave the node running at the end (down it yourself:
#                                   e2e/realnode.sh down DIR)
#   e2e/realnode-test.sh --demo     only bring up the demo (operator + examples) and leave it up
#                                   (scripts/demo.sh --real-node)
#
# Scenarios, each timed:
#   r1 the node runs pods of the larch image: the operator (helm install, restricted namespace)
#   r2 a one-shot ArchiveExport to SeaweedFS: its Job completes, the archive's objects are in the bucket
#   r3 an ArchiveSource StatefulSet with PVC state (static local PVs): Ready; its pod deleted, the
#      new pod gets the same claim and volume and finds its state file there
#   r4 a query through the ArchiveSource's Service ClusterIP (kube-proxy's iptables rules in the
#      node's namespace) returns rows, the same count as PostgreSQL
#   r5 Pod Security restricted: enforced on every namespace used; no pod creation was refused, no
#      pod violates it (server dry run of the label), every pod Running or Succeeded
#
# Budget: LARCH_REALNODE_BUDGET seconds for the whole run (default 1200); exceeded -> failure.
# DIR: LARCH_REALNODE_DIR (default /var/tmp/larch-realnode-test; --keep and --demo:
# /var/tmp/larch-realnode). The image: LARCH_IMAGE (default localhost/larch:dev), which must exist
# (scripts/image.sh build).
set -Eeuo pipefail
trap 'echo "realnode-test.sh: line $LINENO failed (exit $?): $BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "$0")/.." && pwd)
export LARCH_CACHE=${LARCH_CACHE:-$HOME/.cache/larch}
budget=${LARCH_REALNODE_BUDGET:-1200}
mode=test
case "${1:-}" in
  --keep) mode=keep ;;
  --demo) mode=demo ;;
  "") ;;
  *) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
# the test's node and the demo's do not share a directory (nor a network namespace)
if [[ $mode == test ]]; then dir=${LARCH_REALNODE_DIR:-/var/tmp/larch-realnode-test}
else dir=${LARCH_REALNODE_DIR:-/var/tmp/larch-realnode}; fi
ns=larch-demo
t0=$SECONDS
step_t=$SECONDS
step() { echo; echo "== $* ($((SECONDS - t0))s)"; step_t=$SECONDS; }
done_step() { echo "   ok: $* ($((SECONDS - step_t))s)"; }
fail() {
  echo "realnode-test: FAILED: $*" >&2
  if [[ -n "${KUBECTL:-}" ]]; then
    "$KUBECTL" get pods,jobs,statefulsets,pvc -A -o wide >&2 || true
    "$KUBECTL" get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 30 >&2 || true
  fi
  exit 1
}
within_budget() { ((SECONDS - t0 < budget)) || fail "over the budget of ${budget}s"; }
wait_for() { # SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2 w0=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    within_budget
    ((SECONDS - w0 < limit)) || fail "timed out after ${limit}s: $what"
    sleep 1
  done
}

cleanup() {
  local rc=$?
  if [[ "$mode" == test || $rc -ne 0 && "$mode" != keep ]]; then
    if ((rc != 0)) && [[ -d "$dir/logs" ]]; then
      rm -rf "$LARCH_CACHE/realnode-logs" && mkdir -p "$LARCH_CACHE/realnode-logs"
      cp -r "$dir/logs/." "$LARCH_CACHE/realnode-logs/" 2>/dev/null || true
      cp -r "$dir/pod-logs" "$LARCH_CACHE/realnode-logs/" 2>/dev/null || true
      cp -r "$dir/cluster/logs" "$LARCH_CACHE/realnode-logs/cluster" 2>/dev/null || true
      echo "realnode-test: logs kept in $LARCH_CACHE/realnode-logs" >&2
    fi
    bash "$here/e2e/realnode.sh" down "$dir" || true
  fi
  echo "realnode-test: $([[ $rc -eq 0 ]] && echo passed || echo failed) in $((SECONDS - t0))s" >&2
}
trap cleanup EXIT

if [[ -e "$dir" ]]; then
  step "removing the previous node in $dir"
  bash "$here/e2e/realnode.sh" down "$dir"
fi
step "the node: network namespace, control plane, PostgreSQL, SeaweedFS, containerd, kubelet, kube-proxy"
bash "$here/e2e/realnode.sh" up "$dir"
# shellcheck disable=SC1091
. "$dir/env"
kubectl() { "$KUBECTL" "$@"; }
done_step "node larch-node Ready"

# ---------------------------------------------------------------------------------------------
step "r1: helm install larch (image $LARCH_E2E_IMAGE from containerd) into a restricted namespace"
restricted() { # NAMESPACE: enforce (and warn, audit) restricted
  kubectl create namespace "$1" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl label namespace "$1" --overwrite pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/warn=restricted pod-security.kubernetes.io/audit=restricted >/dev/null
}
restricted larch-system
# static local PVs for the engines' state (no provisioner on this node)
mkdir -p "$dir/pv"
for i in 1 2 3 4; do
  mkdir -p "$dir/pv/pv$i"
  cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: larch-local-pv$i, labels: {larch.dev/e2e: realnode}}
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: larch-local
  local: {path: $dir/pv/pv$i}
  nodeAffinity:
    required:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [larch-node]}]}]
EOF
done | kubectl apply -f - >/dev/null
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: larch-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
EOF
"$HELM" install larch "$here/charts/larch" --namespace larch-system \
  --set image.repository="${LARCH_E2E_IMAGE%:*}" --set image.tag="${LARCH_E2E_IMAGE##*:}" \
  --wait --timeout 300s >/dev/null || fail "helm install"
op=$(kubectl get pods -n larch-system -l app.kubernetes.io/name=larch -o jsonpath='{.items[0].metadata.name}')
kubectl get pods -n larch-system -o wide
img=$(kubectl get pod -n larch-system "$op" -o jsonpath='{.status.containerStatuses[0].image}')
[[ "$img" == *"${LARCH_E2E_IMAGE#localhost/}" ]] || fail "operator pod runs $img"
done_step "operator $op Running on larch-node, image $img"

# ---------------------------------------------------------------------------------------------
step "r2: a one-shot ArchiveExport to SeaweedFS (examples/, adapted by e2e/examples.sh) in restricted namespace $ns"
kubectl apply --server-side -f "$here/crds/" >/dev/null
restricted "$ns"
# examples.sh creates the buckets with curl: inside the node's namespace
bash "$here/e2e/realnode.sh" exec "$dir" bash "$here/e2e/examples.sh" "$dir" "$ns" >"$dir/examples.json"
kubectl apply --server-side -f "$dir/examples.json" >/dev/null
wait_for 600 "ArchiveExport users LastExportSucceeded" \
  kubectl wait -n "$ns" --for=condition=LastExportSucceeded archiveexport/users --timeout=5s
job=$(kubectl get jobs -n "$ns" -o jsonpath='{.items[?(@.status.succeeded==1)].metadata.name}')
[[ -n "$job" ]] || fail "no completed Job in $ns"
bucket=$(python3 -c 'import json,sys; o=[i for i in json.load(open(sys.argv[1]))["items"] if i["kind"]=="ArchiveExport" and i["metadata"]["name"]=="users"][0]; print(o["spec"]["destination"]["s3"]["bucket"])' "$dir/examples.json")
keys=$("$CURL" -sf "$LARCH_E2E_S3_ENDPOINT/$bucket?list-type=2" | grep -o '<Key>[^<]*</Key>' | sed 's/<[^>]*>//g')
grep -q manifest <<<"$keys" || fail "no manifest in bucket $bucket: $keys"
done_step "Job $job completed; bucket $bucket holds $(wc -l <<<"$keys") objects: $(tr '\n' ' ' <<<"$keys" | cut -c1-200)"

# ---------------------------------------------------------------------------------------------
step "r3: ArchiveSource users-cache: a StatefulSet with PVC state"
wait_for 600 "ArchiveSource users-cache Ready" \
  kubectl wait -n "$ns" --for=condition=Ready archivesource/users-cache --timeout=5s
kubectl get archives -n "$ns"
kubectl get pvc -n "$ns"
pod=users-cache-0
claim=$(kubectl get pod -n "$ns" $pod -o jsonpath='{.spec.volumes[?(@.name=="state")].persistentVolumeClaim.claimName}')
[[ -n "$claim" ]] || fail "$pod has no state claim"
pv=$(kubectl get pvc -n "$ns" "$claim" -o jsonpath='{.spec.volumeName}')
pvpath=$(kubectl get pv "$pv" -o jsonpath='{.spec.local.path}')
wait_for 120 "a state file on $pv" bash -c 'ls "$1"/*.pos' _ "$pvpath"
state=$(ls "$pvpath"/*.pos)
before=$(cat "$state")
uid_before=$(kubectl get pod -n "$ns" $pod -o jsonpath='{.metadata.uid}')
claim_uid=$(kubectl get pvc -n "$ns" "$claim" -o jsonpath='{.metadata.uid}')
echo "   $pod: claim $claim -> $pv ($pvpath), state $(basename "$state"): $before"
kubectl delete pod -n "$ns" $pod --wait=true >/dev/null
wait_for 300 "a new $pod Ready" bash -c '
  [[ "$("$1" get pod -n "$2" "$3" -o jsonpath="{.metadata.uid}")" != "$4" ]] &&
  "$1" wait -n "$2" --for=condition=Ready pod/"$3" --timeout=5s' _ "$KUBECTL" "$ns" $pod "$uid_before"
[[ "$(kubectl get pvc -n "$ns" "$claim" -o jsonpath='{.metadata.uid}')" == "$claim_uid" ]] || fail "claim $claim was recreated"
[[ "$(kubectl get pvc -n "$ns" "$claim" -o jsonpath='{.spec.volumeName}')" == "$pv" ]] || fail "claim $claim moved off $pv"
[[ -f "$state" ]] || fail "state file $state gone"
after=$(cat "$state")
wait_for 300 "ArchiveSource users-cache Ready again" \
  kubectl wait -n "$ns" --for=condition=Ready archivesource/users-cache --timeout=5s
new_ip=$(kubectl get pod -n "$ns" $pod -o jsonpath='{.status.podIP}')
# what the new pod's engine sees at its state path: the container's root, from its process
cid=$(kubectl get pod -n "$ns" $pod -o jsonpath='{.status.containerStatuses[0].containerID}')
cpid=$(ctr -a "$dir/containerd/containerd.sock" -n k8s.io tasks ls | awk -v id="${cid#containerd://}" '$1 == id { print $2 }')
[[ -n "$cpid" ]] || fail "no task for container $cid"
seen=$(cat "/proc/$cpid/root/var/lib/larch/state/$(basename "$state")") || fail "the new engine has no $(basename "$state")"
[[ "$seen" == "$after" ]] || fail "the new engine sees $seen, the volume holds $after"
done_step "new $pod ($new_ip) on the same claim $claim and volume $pv; its engine (pid $cpid) reads the state written before ($before -> $after)"

# ---------------------------------------------------------------------------------------------
step "r4: a query through Service users-cache's ClusterIP"
cip=$(kubectl get svc -n "$ns" users-cache -o jsonpath='{.spec.clusterIP}')
[[ "$cip" == 10.0.0.* ]] || fail "ClusterIP $cip"
rows=$("$CURL" -sf --max-time 5 "http://$cip:8080/tables/public.events/rows?limit=2&tenant=tenant-7") || fail "no answer from $cip:8080"
echo "   \$ curl 'http://$cip:8080/tables/public.events/rows?limit=2&tenant=tenant-7'"
echo "   $rows" | cut -c1-300
grep -q '"tenant":"tenant-7"' <<<"$rows" || fail "no tenant-7 rows through $cip"
count=$("$CURL" -sf --max-time 5 "http://$cip:8080/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(sum(v.get("row_count") or 0 for v in s["pipelines"].values()))')
pg=$("$PSQL" -X -At -d app -c "SELECT count(*) FROM public.events")
[[ "$count" == "$pg" ]] || fail "the engine behind $cip has $count rows, PostgreSQL $pg"
done_step "ClusterIP $cip:8080 -> the engines: $count rows, as PostgreSQL"

# ---------------------------------------------------------------------------------------------
step "r5: Pod Security restricted, enforced, nothing refused"
for n in larch-system "$ns"; do
  [[ "$(kubectl get ns "$n" -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')" == restricted ]] \
    || fail "$n does not enforce restricted"
  # the API server warns about every existing pod the label would forbid
  warn=$(kubectl label ns "$n" --overwrite --dry-run=server pod-security.kubernetes.io/enforce=restricted 2>&1 >/dev/null | grep -i '^warning' || true)
  [[ -z "$warn" ]] || fail "pods of $n violate restricted: $warn"
done
refused=$(kubectl get events -A --field-selector reason=FailedCreate -o jsonpath='{range .items[*]}{.involvedObject.kind}/{.involvedObject.name}: {.message}{"\n"}{end}')
[[ -z "$refused" ]] || fail "pod creation refused: $refused"
bad=$(kubectl get pods -A --no-headers -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name,PHASE:.status.phase | awk '$3 != "Running" && $3 != "Succeeded"')
[[ -z "$bad" ]] || fail "pods neither Running nor Succeeded: $bad"
kubectl get pods -A -o wide
done_step "larch-system and $ns enforce restricted; no FailedCreate, no violation, every pod Running or Succeeded"

within_budget
if [[ "$mode" != test ]]; then
  cat <<EOF

== the real node is up ($((SECONDS - t0))s). Use it through the wrappers (they enter its network namespace):

  . $dir/env
  \$KUBECTL get archives -A
  \$CURL http://$cip:8080/tables/public.events/rows?limit=2
  \$PSQL -d app

Tear down: e2e/realnode.sh down $dir   (or scripts/demo.sh --real-node down)
EOF
fi
