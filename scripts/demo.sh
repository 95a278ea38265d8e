#!/usr/bin/env bash
# The local demo: a Kubernetes control plane, PostgreSQL 15 with a sample of events.sql, SeaweedFS
# (S3), the fake kubelet (pods run as local `larch` processes) and the larch operator installed by
# helm; then the examples are applied (adapted to this environment by e2e/examples.sh), and once
# they are Ready the demo shows `kubectl get archives` and a query through the engine.
#
#   scripts/demo.sh          bring it up (tears down a previous demo first)
#   scripts/demo.sh down     stop everything and remove its state
#   scripts/demo.sh --real-node [down]
#                            the same on a real node instead of the fake kubelet (e2e/realnode.sh):
#                            the larch image (scripts/image.sh; LARCH_BIN=... to use a built
#                            binary) run by a kubelet through containerd + runc, in a network
#                            namespace of its own; the scenarios of e2e/realnode-test.sh run, and the
#                            node stays up (under ${LARCH_REALNODE_DIR:-/var/tmp/larch-realnode})
#
# Everything lives under ${LARCH_DEMO_DIR:-$HOME/.cache/larch/demo}. On a fresh machine it first
# installs what is missing (scripts/setup.sh) and builds the control plane and helm
# (e2e/build.sh, ~16 min cold, cached), larch and the fake kubelet.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
export LARCH_CACHE=${LARCH_CACHE:-$HOME/.cache/larch}
demo=${LARCH_DEMO_DIR:-$LARCH_CACHE/demo}
ns=demo

if [ "${1:-}" = --real-node ]; then
  export LARCH_REALNODE_DIR=${LARCH_REALNODE_DIR:-/var/tmp/larch-realnode}
  case "${2:-up}" in
    down) exec bash e2e/realnode.sh down "$LARCH_REALNODE_DIR" ;;
    up) ;;
    *) echo "usage: $0 --real-node [up|down]" >&2; exit 2 ;;
  esac
  bash scripts/setup.sh
  bash e2e/realnode.sh setup
  bash e2e/build.sh larch-cp helm larch-node
  bash scripts/image.sh build
  exec bash e2e/realnode-test.sh --demo
fi

case "${1:-up}" in
  down)
    bash e2e/env.sh down "$demo"
    exit 0
    ;;
  up) ;;
  *) echo "usage: $0 [--real-node] [up|down]" >&2; exit 2 ;;
esac

t0=$SECONDS
step() { echo; echo "== $* ($((SECONDS - t0))s)"; }

step "setup"
bash scripts/setup.sh
bash e2e/build.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$LARCH_CACHE/target}
step "building larch and the fake kubelet"
cargo build --locked --bin larch
cargo build --locked --manifest-path e2e/fake-kubelet/Cargo.toml

if [ -e "$demo" ]; then
  step "removing the previous demo in $demo"
  bash e2e/env.sh down "$demo"
fi
step "environment: control plane, PostgreSQL 15, SeaweedFS, fake kubelet"
if ! LARCH_BIN=$CARGO_TARGET_DIR/debug/larch LARCH_FAKE_KUBELET=$CARGO_TARGET_DIR/debug/larch-fake-kubelet \
  bash e2e/env.sh up "$demo"; then
  bash e2e/env.sh down "$demo"
  exit 1
fi
# shellcheck disable=SC1091
. "$demo/env"
kubectl() { "$KUBECTL" "$@"; }

step "helm install larch (image larch.local/larch:demo, mapped by the fake kubelet to this build)"
"$HELM" install larch charts/larch --namespace larch-system --create-namespace \
  --set image.repository=larch.local/larch --set image.tag=demo --wait --timeout 300s
kubectl get pods -n larch-system -o wide

step "applying crds/ (server-side) and examples/ into namespace $ns"
kubectl apply --server-side -f crds/
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
bash e2e/examples.sh "$demo" "$ns" | kubectl apply --server-side -f -

step "waiting for the one-shot export and its engine to be Ready"
kubectl wait -n "$ns" --for=condition=LastExportSucceeded archiveexport/users --timeout=600s
kubectl wait -n "$ns" --for=condition=Ready archivesource/users-cache --timeout=600s
kubectl get archives -n "$ns"

step "a query through the engine (pod users-cache-0, port 8080)"
ip=$(kubectl get pod -n "$ns" users-cache-0 -o jsonpath='{.status.podIP}')
echo "\$ curl 'http://$ip:8080/tables/public.events/rows?limit=2&tenant=tenant-7'"
curl -sf "http://$ip:8080/tables/public.events/rows?limit=2&tenant=tenant-7"
echo
echo "\$ psql -c 'SELECT count(*) FROM events'   # vs. the engine's /status"
/usr/lib/postgresql/15/bin/psql -X -At -h 127.0.0.1 -p "$LARCH_E2E_PG_PORT" -U postgres -d app \
  -c "SELECT count(*) FROM public.events"
curl -sf "http://$ip:8080/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); print({k: v.get("row_count") for k, v in s["pipelines"].items()})'

cat <<EOF

== the demo is up ($((SECONDS - t0))s). Point kubectl at it:

  export KUBECONFIG=$KUBECONFIG
  export PATH=$(dirname "$KUBECTL"):\$PATH      # kubectl ($KUBECTL) and helm
  kubectl get archives -A
  kubectl describe archivesource -n $ns users-cache

PostgreSQL: psql -h 127.0.0.1 -p $LARCH_E2E_PG_PORT -U postgres app
S3 (SeaweedFS): $LARCH_E2E_S3_ENDPOINT (any access key pair)
Pod logs: $LARCH_E2E_KUBELET_DATA/<namespace>/<pod>/<container>.log (or kubectl logs)
Tear down: scripts/demo.sh down
EOF
