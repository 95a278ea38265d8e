#!/usr/bin/env bash
# The scenarios on the real node (e2e/realnode.sh): the larch image run by a real kubelet through
# containerd + runc, the operator installed by `helm install`, every namespace enforcing Pod
# Security "restricted".
#
#   e2e/realnode-test.sh            up, scenarios, down (always; logs copied to
#                                   $LARCH_CACHE/realnode-logs on a failure)
#   e2e/realnode-test.sh --keep     leave the node running at the end (down it yourself:
#                                   e2e/realnode.sh down DIR)
#   e2e/realnode-test.sh --demo     only bring up the demo (operator + examples; r1..r5, not r6
#                                   and r7, which change the data) and leave it up
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
#   r6 the continuous ArchiveExport events (examples/): its Deployment's one pod Ready on the node,
#      the Lease named like it held and renewed by that pod; a row updated in PostgreSQL after the
#      baseline reaches the archive: a diff ending past the WAL position before the update in the
#      manifest, its head advanced to it, the diff object in the bucket holding the new value
#   r7 an ArchiveRestore of events (its archive at the head, with r6's diff) into a second
#      database: the Job succeeds, Ready=True, the restored table has the source's row count and
#      the same md5 of its rows in id order; then r5's checks again over r6's and r7's pods
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
  *) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
# the test's node and the demo's do not share a directory (nor a network namespace)
if [[ $mode == test ]]; then dir=${LARCH_REALNODE_DIR:-/var/tmp/larch-realnode-test}
else dir=${LARCH_REALNODE_DIR:-/var/tmp/larch-realnode}; fi
ns=larch-demo
t0=$SECONDS
step_t=$SECONDS
step() { echo; echo "== $* ($((SECONDS - t0))s)"; step_t=$SECONDS; }
done_step() { echo "   ok: $* ($((SECONDS - step_t))s)"; }
# What a step's failure dumps besides every pod and the last events: (NAMESPACE SELECTOR OBJECT)
# -> the matching pods' description and logs (also of a previous container), the object's status.
diag=()
pod_diag() { # NAMESPACE SELECTOR [OBJECT]
  local p
  echo "--- kubectl describe pods -n $1 -l $2"
  "$KUBECTL" describe pods -n "$1" -l "$2" | tail -n 80
  for p in $("$KUBECTL" get pods -n "$1" -l "$2" -o name); do
    echo "--- logs of $p"
    "$KUBECTL" logs -n "$1" "$p" --all-containers --tail=60 || true
    "$KUBECTL" logs -n "$1" "$p" --all-containers --tail=30 --previous 2>/dev/null || true
  done
  if [[ -n "${3:-}" ]]; then
    echo "--- status of $3"
    "$KUBECTL" get -n "$1" "$3" -o jsonpath='{.status}' | python3 -m json.tool || true
  fi
}
fail() {
  echo "realnode-test: FAILED: $*" >&2
  if [[ -n "${KUBECTL:-}" ]]; then
    "$KUBECTL" get pods,jobs,deployments,statefulsets,pvc,leases -A -o wide >&2 || true
    "$KUBECTL" get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -n 30 >&2 || true
    if ((${#diag[@]})); then pod_diag "${diag[@]}" >&2 || true; fi
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
# the restore example (users-staging) starts once the export has written: its run ends before r5
wait_for 180 "ArchiveRestore users-staging run ended" bash -c '
  [[ -n "$("$1" get archiverestore -n "$2" users-staging -o jsonpath="{.status.run.succeeded}")" ]]' \
  _ "$KUBECTL" "$ns"
[[ "$(kubectl get archiverestore -n "$ns" users-staging -o jsonpath='{.status.run.succeeded}')" == true ]] \
  || fail "ArchiveRestore users-staging failed: $(kubectl get archiverestore -n "$ns" users-staging -o jsonpath='{.status.conditions}')"

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
# the token the operator generated for users-cache (its tables need it by default)
token=$(kubectl get secret -n "$ns" users-cache-engine-token -o go-template='{{.data.token | base64decode}}') || fail "no generated token"
rows=$("$CURL" -sf --max-time 5 -H "Authorization: Bearer $token" "http://$cip:8080/tables/public.events/rows?limit=2&tenant=tenant-7") || fail "no answer from $cip:8080"
echo "   \$ curl -H 'Authorization: Bearer <token>' 'http://$cip:8080/tables/public.events/rows?limit=2&tenant=tenant-7'"
echo "   $rows" | cut -c1-300
grep -q '"tenant":"tenant-7"' <<<"$rows" || fail "no tenant-7 rows through $cip"
count=$("$CURL" -sf --max-time 5 "http://$cip:8080/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(sum(v.get("row_count") or 0 for v in s["pipelines"].values()))')
pg=$("$PSQL" -X -At -d app -c "SELECT count(*) FROM public.events")
[[ "$count" == "$pg" ]] || fail "the engine behind $cip has $count rows, PostgreSQL $pg"
done_step "ClusterIP $cip:8080 -> the engines: $count rows, as PostgreSQL"

# ---------------------------------------------------------------------------------------------
step "r5: Pod Security restricted, enforced, nothing refused"
pod_security() { # r5's checks, over the pods there are now
  local n warn refused bad
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
}
pod_security
kubectl get pods -A -o wide
done_step "larch-system and $ns enforce restricted; no FailedCreate, no violation, every pod Running or Succeeded"

finish() {
  if [[ "$mode" != test ]]; then
    cat <<EOF

== the real node is up ($((SECONDS - t0))s). Use it through the wrappers (they enter its network namespace):

  . $dir/env
  \$KUBECTL get archives -A
  \$CURL http://$cip:8080/tables/public.events/rows?limit=2
  \$PSQL -d app$([[ "$mode" == keep ]] && echo "      (and -d restored: r7's ArchiveRestore)")

Tear down: e2e/realnode.sh down $dir   (or scripts/demo.sh --real-node down)
EOF
  fi
}
# The demo stops here: r6 and r7 change a row of app.public.events and add a database.
if [[ "$mode" == demo ]]; then within_budget; finish; exit 0; fi

# ---------------------------------------------------------------------------------------------
# The bucket of an ArchiveExport of examples.json.
export_bucket() {
  python3 -c 'import json,sys; o=[i for i in json.load(open(sys.argv[1]))["items"] if i["kind"]=="ArchiveExport" and i["metadata"]["name"]==sys.argv[2]][0]; print(o["spec"]["destination"]["s3"]["bucket"])' "$dir/examples.json" "$1"
}
# The archive BUCKET/PREFIX's manifest holds a diff ending after the position AFTER and its head is
# at least there: prints the head and the newest such diff's object (bucket/key); else exit 1.
diff_after() { # BUCKET PREFIX AFTER
  "$CURL" -sf --max-time 5 "$LARCH_E2E_S3_ENDPOINT/$1/${2}manifest.json" | python3 -c '
import json, sys
def lsn(p):
    hi, lo = p.split("/")
    return int(hi, 16) << 32 | int(lo, 16)
m = json.load(sys.stdin)
after = lsn(sys.argv[1])
diffs = [a for a in m["artifacts"] if a["kind"] == "diff" and lsn(a["to_position"]) > after]
if not diffs or lsn(m["head_position"]) < lsn(diffs[-1]["to_position"]):
    sys.exit(1)
uri = next(iter(diffs[-1]["formats"].values()))["uri"]
print(m["head_position"], uri.split("://", 1)[-1])' "$3"
}

step "r6: the continuous ArchiveExport events: a Deployment with its Lease, a change in PostgreSQL reaching the archive"
diag=("$ns" larch.dev/archive-export=events archiveexport/events)
wait_for 300 "ArchiveExport events Ready or Stalled" bash -c '
  "$1" get archiveexport -n "$2" events -o jsonpath="{.status.conditions[?(@.status==\"True\")].type}" | grep -qw "Ready\|Stalled"' \
  _ "$KUBECTL" "$ns"
[[ "$(kubectl get archiveexport -n "$ns" events -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] \
  || fail "ArchiveExport events stalled: $(kubectl get archiveexport -n "$ns" events -o jsonpath='{.status.conditions[?(@.type=="Stalled")].message}')"
dep=$(kubectl get deployment -n "$ns" events -o jsonpath='{.spec.replicas} {.spec.strategy.type} {.status.readyReplicas}') \
  || fail "no Deployment events"
[[ "$dep" == "1 Recreate 1" ]] || fail "Deployment events: replicas, strategy, ready = $dep (want 1 Recreate 1)"
writers=$(kubectl get pods -n "$ns" -l larch.dev/archive-export=events \
  -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}')
[[ $(wc -w <<<"$writers") == 1 ]] || fail "want one running writer pod of events, have: $writers"
writer=$writers
wait_for 120 "writer pod $writer Ready" kubectl wait -n "$ns" --for=condition=Ready pod/"$writer" --timeout=5s
wnode=$(kubectl get pod -n "$ns" "$writer" -o jsonpath='{.spec.nodeName}')
[[ "$wnode" == larch-node ]] || fail "writer $writer on node '$wnode'"
wait_for 60 "Lease events held by $writer" \
  bash -c '[[ "$("$1" get lease -n "$2" events -o jsonpath="{.spec.holderIdentity}")" == "$3" ]]' _ "$KUBECTL" "$ns" "$writer"
renewed=$(kubectl get lease -n "$ns" events -o jsonpath='{.spec.renewTime}')
bucket=$(export_bucket events)
prefix=public.events/
manifest0=$("$CURL" -sf --max-time 5 "$LARCH_E2E_S3_ENDPOINT/$bucket/${prefix}manifest.json") \
  || fail "no manifest of events in bucket $bucket"
head0=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["head_position"])' "$manifest0")
# the change: one row, after the baseline; the diff that holds it ends past the WAL position before it
before=$("$PSQL" -X -At -d app -c "SELECT pg_current_wal_lsn()")
"$PSQL" -X -q -d app -c "UPDATE public.events SET tenant = 'r6-changed', amount = 4242.42 WHERE id = 7"
echo "   $writer holds Lease events; baseline head $head0; UPDATE of id 7 after WAL position $before"
# the example's diffInterval is 30s: the change is in the archive within it
wait_for 120 "a diff of events past $before in bucket $bucket (diffInterval 30s)" diff_after "$bucket" "$prefix" "$before"
read -r head1 object < <(diff_after "$bucket" "$prefix" "$before") || true
[[ -n "${object:-}" ]] || fail "the manifest of events lost its diff past $before"
diff=$("$CURL" -sf --max-time 5 "$LARCH_E2E_S3_ENDPOINT/$object") || fail "diff object $object missing from the bucket"
grep -q '"tenant":"r6-changed"' <<<"$diff" || fail "diff $object does not hold the update: $(head -c 400 <<<"$diff")"
wip=$(kubectl get pod -n "$ns" "$writer" -o jsonpath='{.status.podIP}')
wstatus=$("$CURL" -sf --max-time 5 "http://$wip:8080/status") || fail "no /status from writer $writer at $wip:8080"
read -r wstate wdiffs < <(python3 -c 'import json,sys; s=json.loads(sys.argv[1]); print(s["state"], s["diffs"])' "$wstatus")
((wdiffs >= 1)) || fail "writer $writer reports $wdiffs diffs: $wstatus"
# still the holder, renewing (every 3 s), with no restart
wait_for 30 "Lease events renewed by $writer" bash -c '
  [[ "$("$1" get lease -n "$2" events -o jsonpath="{.spec.holderIdentity} {.spec.renewTime}")" == "$3 "* ]] &&
  [[ "$("$1" get lease -n "$2" events -o jsonpath="{.spec.renewTime}")" != "$4" ]]' _ "$KUBECTL" "$ns" "$writer" "$renewed"
restarts=$(kubectl get pod -n "$ns" "$writer" -o jsonpath='{.status.containerStatuses[0].restartCount}')
[[ "$restarts" == 0 ]] || fail "writer $writer restarted $restarts times"
done_step "writer $writer ($wip) Ready on $wnode, holding and renewing Lease events ($wstate, $wdiffs diffs); head $head0 -> $head1, $object holds the update"

# ---------------------------------------------------------------------------------------------
step "r7: an ArchiveRestore of events into a second database (a Job on the node)"
diag=("$ns" larch.dev/archive-restore=events-back archiverestore/events-back)
digest() { # DATABASE: row count and md5 of the rows in id order
  "$PSQL" -X -At -d "$1" -c "SELECT count(*)::text || ' rows, md5 ' || md5(string_agg(t::text, '|' ORDER BY id)) FROM public.events t"
}
"$PSQL" -X -q -d app -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS restored" -c "CREATE DATABASE restored"
kubectl create secret generic pg-restored -n "$ns" --from-literal=dsn="${LARCH_E2E_PG_DSN/dbname=app/dbname=restored}" \
  --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: larch.dev/v1alpha1
kind: ArchiveRestore
metadata: {name: events-back, namespace: $ns}
spec:
  archive:
    exportRef: {name: events}
  target:
    postgres:
      connectionSecretRef: {name: pg-restored, key: dsn}
  ifExists: Fail
  backoffLimit: 0
EOF
# ends with the run, or at once when the restore stalls before it (a spec or reference it rejects)
wait_for 180 "ArchiveRestore events-back run ended" bash -c '
  [[ -n "$("$1" get archiverestore -n "$2" events-back -o jsonpath="{.status.run.succeeded}")" ||
     "$("$1" get archiverestore -n "$2" events-back -o jsonpath="{.status.conditions[?(@.type==\"Stalled\")].status}")" == True ]]' \
  _ "$KUBECTL" "$ns"
[[ "$(kubectl get archiverestore -n "$ns" events-back -o jsonpath='{.status.run.succeeded}')" == true ]] \
  || fail "ArchiveRestore events-back failed: $(kubectl get archiverestore -n "$ns" events-back -o jsonpath='{.status.conditions[?(@.type=="Stalled")].message}')"
kubectl wait -n "$ns" --for=condition=Ready archiverestore/events-back --timeout=30s >/dev/null \
  || fail "ArchiveRestore events-back not Ready"
run=$(kubectl get archiverestore -n "$ns" events-back -o jsonpath='{.status.run.id}')
rjob=events-back-$run
[[ "$(kubectl get job -n "$ns" "$rjob" -o jsonpath='{.status.succeeded}')" == 1 ]] || fail "Job $rjob did not succeed"
rpod=$(kubectl get pods -n "$ns" -l larch.dev/archive-restore=events-back -o jsonpath='{range .items[?(@.status.phase=="Succeeded")]}{.metadata.name} {.spec.nodeName}{"\n"}{end}')
[[ "$rpod" == *" larch-node" ]] || fail "no succeeded restore pod on larch-node: '$rpod'"
position=$(kubectl get archiverestore -n "$ns" events-back -o jsonpath='{.status.position}')
rrows=$(kubectl get archiverestore -n "$ns" events-back -o jsonpath='{.status.tables[0].table} {.status.tables[0].rows} {.status.tables[0].action}')
src_digest=$(digest app)
restored=$(digest restored)
echo "   source:   $src_digest"
echo "   restored: $restored (status: $rrows at $position)"
[[ "$restored" == "$src_digest" ]] || fail "the restored table differs from the source: $restored vs $src_digest"
[[ "$rrows" == "public.events ${src_digest%% *} created" ]] || fail "status.tables[0]: $rrows, the source has ${src_digest%% *} rows"
[[ "$position" == "$head1" ]] || fail "restored at $position, the archive's head is $head1"
[[ "$("$PSQL" -X -At -d restored -c "SELECT tenant FROM public.events WHERE id = 7")" == r6-changed ]] \
  || fail "the restored row 7 lacks r6's update"
diag=()
pod_security
done_step "Job $rjob succeeded (pod ${rpod% *}); database restored = app: ${restored}; at the head $position with r6's update; r5's checks hold for every pod"

within_budget
finish
