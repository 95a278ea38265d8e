#!/usr/bin/env bash
# A local Kubernetes control plane for larch's end-to-end tests, made of separate processes of the
# multi-call binary larch-cp (see e2e/controlplane): etcd -> kube-apiserver ->
# kube-controller-manager -> kube-scheduler, all on 127.0.0.1, no kubelet (pods stay Pending until
# a fake kubelet marks them).
#
#   e2e/cluster.sh up DIR       start a cluster whose state lives in DIR (created); waits for /readyz
#   e2e/cluster.sh down DIR     stop it and remove its state (LARCH_E2E_KEEP_LOGS=1 keeps DIR/logs)
#   e2e/cluster.sh env DIR      print `export KUBECONFIG=DIR/kubeconfig` (and PATH for kubectl/helm)
#   e2e/cluster.sh status DIR   show the processes and /readyz
#
# DIR afterwards holds: kubeconfig (admin, group system:masters, CA embedded), cluster.env (ports,
# URLs, file paths; shell syntax), pki/ (CA, serving and client certs, service-account key pair),
# logs/<component>.log, run/<component>.pid, etcd/ (data).
#
# Environment:
#   LARCH_CACHE            cache root (default ~/.cache/larch); binaries from $LARCH_CACHE/bin
#   LARCH_CP               path of larch-cp (default $LARCH_CACHE/bin/larch-cp; built by e2e/build.sh if missing)
#   LARCH_E2E_KCM_CONTROLLERS   --controllers for KCM (default "*,-node-lifecycle-controller")
#   LARCH_E2E_SCHEDULER=0  do not start kube-scheduler
#   LARCH_E2E_V            klog verbosity of the Kubernetes components (default 1)
#   LARCH_E2E_TIMEOUT      seconds to wait for each component (default 120)
#   LARCH_E2E_NODE_IP      for a real node (e2e/realnode.sh, run inside its network namespace):
#                          kube-apiserver listens on every address of the namespace, advertises
#                          this one (also in its certificate) and keeps the `kubernetes` Service's
#                          endpoints (--endpoint-reconciler-type=lease), so pods reach it at 10.0.0.1
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
LARCH_CACHE="${LARCH_CACHE:-$HOME/.cache/larch}"
BIN="$LARCH_CACHE/bin"
CP="${LARCH_CP:-$BIN/larch-cp}"
TIMEOUT="${LARCH_E2E_TIMEOUT:-120}"
VERBOSITY="${LARCH_E2E_V:-1}"
NODE_IP="${LARCH_E2E_NODE_IP:-}"
if [[ -n "$NODE_IP" ]]; then
  APISERVER_BIND=0.0.0.0 APISERVER_ADVERTISE="$NODE_IP" ENDPOINT_RECONCILER=lease
  KUBELET_ADDRESS_TYPES=InternalIP   # logs/exec: the node's address, never a DNS lookup of its name
else
  APISERVER_BIND=127.0.0.1 APISERVER_ADVERTISE=127.0.0.1 ENDPOINT_RECONCILER=none
  KUBELET_ADDRESS_TYPES=Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP   # the default
fi
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)

# Ports nobody else in the test suite may lose: SeaweedFS (`weed mini` opens fixed ports) and PostgreSQL.
RESERVED_PORTS=" 9333 9340 8888 8181 9101 19333 19340 18888 23646 33646 55432 "
# Allocate below the kernel's ephemeral range (32768-60999 by default) so outgoing connections
# cannot take a port between our check and the component's bind.
PORT_MIN=20000
PORT_MAX=32000

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

usage() {
  sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --------------------------------------------------------------------------------------------
# ports

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_ports N -> N distinct free ports in [PORT_MIN, PORT_MAX], not reserved, not listening,
# not held by another cluster started by this script (their cluster.env files are read by the
# caller under the lock, see taken_ports).
free_ports() {
  local n="$1" taken="$2" out=() p tries=0
  while ((${#out[@]} < n)); do
    ((tries++ < 5000)) || die "no free ports found in $PORT_MIN-$PORT_MAX"
    p=$((PORT_MIN + (RANDOM * 32768 + RANDOM) % (PORT_MAX - PORT_MIN)))
    [[ "$RESERVED_PORTS" == *" $p "* || " $taken ${out[*]} " == *" $p "* ]] && continue
    port_in_use "$p" && continue
    out+=("$p")
  done
  echo "${out[*]}"
}

# ports recorded by clusters that are still running (their processes may not listen yet)
taken_ports() {
  local reg="$LARCH_CACHE/clusters" f d
  [[ -d "$reg" ]] || return 0
  for f in "$reg"/*; do
    [[ -f "$f" ]] || continue
    d="$(cat "$f")"
    if [[ -f "$d/cluster.env" ]]; then
      sed -n 's/^LARCH_E2E_[A-Z_]*PORT=\([0-9]*\)$/\1/p' "$d/cluster.env"
    else
      rm -f "$f"
    fi
  done | tr '\n' ' '
}

# --------------------------------------------------------------------------------------------
# PKI (openssl): one CA signs the apiserver serving cert and all client certs. kube-rs with rustls
# rejects a self-signed leaf, so clients must trust the CA, not the leaf.

make_pki() {
  local pki="$1"
  mkdir -p "$pki"
  (
    cd "$pki"
    umask 077
    # ECDSA P-256 keys (PKCS#8 PEM): generated in milliseconds where RSA-2048 takes ~1 s each on a
    # busy 2-core machine; accepted by Go (apiserver, ES256 service-account tokens), rustls/kube-rs,
    # openssl and curl.
    quiet() { local out; out="$("$@" 2>&1)" || { echo "$out" >&2; return 1; }; }
    keygen() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
    keygen ca.key
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=larch-e2e-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -addext "subjectKeyIdentifier=hash" -out ca.crt

    # leaf CERT_NAME SUBJECT EXT_FILE_CONTENT
    leaf() {
      keygen "$1.key"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
      printf '%s\n' "$3" > "$1.ext"
      quiet openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
        -extfile "$1.ext" -out "$1.crt"
      rm -f "$1.csr" "$1.ext"
    }
    local client="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
authorityKeyIdentifier=keyid"
    leaf apiserver "/CN=kube-apiserver" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
authorityKeyIdentifier=keyid
subjectAltName=IP:127.0.0.1,${NODE_IP:+IP:$NODE_IP,}DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    leaf admin "/O=system:masters/CN=larch-e2e-admin" "$client"
    leaf kube-controller-manager "/CN=system:kube-controller-manager" "$client"
    leaf kube-scheduler "/CN=system:kube-scheduler" "$client"
    # apiserver -> (future) kubelet / aggregated APIs
    leaf apiserver-kubelet-client "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client" "$client"

    # front-proxy (requestheader) CA + client: lets KCM/scheduler delegated authn find a
    # requestheader CA in kube-system/extension-apiserver-authentication, and serves aggregated APIs
    keygen front-proxy-ca.key
    openssl req -x509 -new -key front-proxy-ca.key -sha256 -days 3650 -subj "/CN=larch-e2e-front-proxy-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -addext "subjectKeyIdentifier=hash" -out front-proxy-ca.crt
    keygen front-proxy-client.key
    openssl req -new -key front-proxy-client.key -subj "/CN=front-proxy-client" -out front-proxy-client.csr
    printf '%s\n' "$client" > front-proxy-client.ext
    quiet openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key \
      -CAcreateserial -sha256 -days 3650 -extfile front-proxy-client.ext -out front-proxy-client.crt
    rm -f front-proxy-client.csr front-proxy-client.ext

    # service-account token signing key pair (apiserver signs, KCM's token controller signs legacy tokens)
    keygen sa.key
    openssl pkey -in sa.key -pubout -out sa.pub
    chmod 644 ./*.crt sa.pub
  )
}

b64() { base64 -w0 < "$1"; }

# kubeconfig FILE USER CERT_BASENAME
write_kubeconfig() {
  local file="$1" user="$2" cert="$3"
  umask 077
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: larch-e2e
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(b64 "$PKI/$cert.crt")
    client-key-data: $(b64 "$PKI/$cert.key")
contexts:
- name: larch-e2e
  context:
    cluster: larch-e2e
    user: $user
    namespace: default
current-context: larch-e2e
EOF
}

# --------------------------------------------------------------------------------------------
# processes

pid_of() { [[ -f "$DIR/run/$1.pid" ]] && cat "$DIR/run/$1.pid"; }

# alive COMPONENT: the recorded pid runs larch-cp (guards against pid reuse)
alive() {
  local pid; pid="$(pid_of "$1" 2>/dev/null)" || return 1
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "larch-cp $1 "
}

start() { # COMPONENT ARGS...
  local c="$1"; shift
  # setsid: own process group, so the caller's Ctrl-C / job control does not hit it
  setsid "$CP" "$c" "$@" > "$DIR/logs/$c.log" 2>&1 < /dev/null &
  echo $! > "$DIR/run/$c.pid"
}

fail_up() {
  log "$1"
  local c
  for c in "${COMPONENTS[@]}"; do
    [[ -f "$DIR/logs/$c.log" ]] || continue
    echo "----- last lines of $DIR/logs/$c.log" >&2
    tail -n 25 "$DIR/logs/$c.log" >&2
  done
  LARCH_E2E_KEEP_LOGS=1 stop_all
  exit 1
}

# wait_for COMPONENT DESCRIPTION COMMAND...
wait_for() {
  local c="$1" what="$2"; shift 2
  local t0=$SECONDS
  until "$@" >/dev/null 2>&1; do
    alive "$c" || fail_up "$c exited while waiting for $what"
    ((SECONDS - t0 < TIMEOUT)) || fail_up "timed out after ${TIMEOUT}s waiting for $what"
    sleep 0.2
  done
  log "$what after $((SECONDS - t0))s"
}

curl_admin() {
  curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"
}

stop_all() {
  local c pid i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    c="${COMPONENTS[$i]}"
    if alive "$c"; then
      pid="$(pid_of "$c")"
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do alive "$c" || break; sleep 0.1; done
      if alive "$c"; then
        log "$c (pid $pid) ignored SIGTERM for 10s, killing"
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do alive "$c" || break; sleep 0.1; done
      fi
    fi
    rm -f "$DIR/run/$c.pid"
  done
  rm -rf "$DIR/etcd" "$DIR/pki" "$DIR/run" "$DIR/certs" "$DIR/kubeconfig" "$DIR"/*.kubeconfig "$DIR/cluster.env"
  [[ "${LARCH_E2E_KEEP_LOGS:-0}" == 1 ]] || rm -rf "$DIR/logs"
  rm -f "$LARCH_CACHE/clusters/$(echo -n "$DIR" | sha256sum | cut -c1-16)"
  rmdir "$DIR" 2>/dev/null || true
}

# --------------------------------------------------------------------------------------------

cmd_up() {
  command -v openssl >/dev/null || die "openssl is required"
  command -v curl >/dev/null || die "curl is required"
  if [[ ! -x "$CP" ]]; then
    log "$CP missing, running e2e/build.sh larch-cp"
    "$here/build.sh" larch-cp >&2
  fi
  local c
  for c in "${COMPONENTS[@]}"; do
    alive "$c" && die "a cluster is already running in $DIR ($c pid $(pid_of "$c")); run: $0 down $DIR"
  done
  stop_all # leftovers of a crashed run
  mkdir -p "$DIR/logs" "$DIR/run" "$LARCH_CACHE/clusters"
  PKI="$DIR/pki"
  local t_start=$SECONDS

  # Serialise port allocation + startup between concurrent `up`s of this script.
  exec 9> "$LARCH_CACHE/clusters/.lock"
  flock 9
  read -r ETCD_PORT ETCD_PEER_PORT APISERVER_PORT KCM_PORT SCHEDULER_PORT <<< "$(free_ports 5 "$(taken_ports)")"
  APISERVER_URL="https://127.0.0.1:$APISERVER_PORT"
  ETCD_URL="http://127.0.0.1:$ETCD_PORT"
  cat > "$DIR/cluster.env" <<EOF
LARCH_E2E_DIR=$DIR
LARCH_E2E_ETCD_PORT=$ETCD_PORT
LARCH_E2E_ETCD_PEER_PORT=$ETCD_PEER_PORT
LARCH_E2E_APISERVER_PORT=$APISERVER_PORT
LARCH_E2E_KCM_PORT=$KCM_PORT
LARCH_E2E_SCHEDULER_PORT=$SCHEDULER_PORT
LARCH_E2E_ETCD_URL=$ETCD_URL
LARCH_E2E_APISERVER_URL=$APISERVER_URL
LARCH_E2E_KUBECONFIG=$DIR/kubeconfig
LARCH_E2E_CA=$PKI/ca.crt
LARCH_E2E_CA_KEY=$PKI/ca.key
LARCH_E2E_ADMIN_CERT=$PKI/admin.crt
LARCH_E2E_ADMIN_KEY=$PKI/admin.key
LARCH_E2E_SA_KEY=$PKI/sa.key
LARCH_E2E_SA_PUB=$PKI/sa.pub
LARCH_CP=$CP
EOF
  echo "$DIR" > "$LARCH_CACHE/clusters/$(echo -n "$DIR" | sha256sum | cut -c1-16)"
  log "ports: etcd $ETCD_PORT (peer $ETCD_PEER_PORT), kube-apiserver $APISERVER_PORT, kube-controller-manager $KCM_PORT, kube-scheduler $SCHEDULER_PORT"

  make_pki "$PKI"
  write_kubeconfig "$DIR/kubeconfig" larch-e2e-admin admin
  write_kubeconfig "$DIR/kube-controller-manager.kubeconfig" system:kube-controller-manager kube-controller-manager
  write_kubeconfig "$DIR/kube-scheduler.kubeconfig" system:kube-scheduler kube-scheduler
  log "pki and kubeconfigs in $((SECONDS - t_start))s"

  # ---- etcd
  start etcd --data-dir="$DIR/etcd" --listen-client-url="$ETCD_URL" \
    --listen-peer-url="http://127.0.0.1:$ETCD_PEER_PORT"
  wait_for etcd "etcd healthy" curl -fsS --max-time 2 "$ETCD_URL/health"

  # ---- kube-apiserver
  start kube-apiserver \
    --etcd-servers="$ETCD_URL" \
    --bind-address="$APISERVER_BIND" --advertise-address="$APISERVER_ADVERTISE" \
    --secure-port="$APISERVER_PORT" \
    --cert-dir="$DIR/certs" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types="$KUBELET_ADDRESS_TYPES" \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,PodSecurity,DefaultTolerationSeconds,ResourceQuota,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
    --disable-admission-plugins=TaintNodesByCondition \
    --allow-privileged=true \
    --endpoint-reconciler-type="$ENDPOINT_RECONCILER" \
    --profiling=false \
    --v="$VERBOSITY"
  wait_for kube-apiserver "kube-apiserver /readyz" curl_admin "$APISERVER_URL/readyz"

  # ---- kube-controller-manager
  start kube-controller-manager \
    --kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$DIR/certs/kcm" \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --cluster-name=larch-e2e \
    --controllers="${LARCH_E2E_KCM_CONTROLLERS:-*,-node-lifecycle-controller}" \
    --profiling=false \
    --v="$VERBOSITY"
  wait_for kube-controller-manager "kube-controller-manager /healthz" \
    curl -fsSk --max-time 2 "https://127.0.0.1:$KCM_PORT/healthz"

  # ---- kube-scheduler
  if [[ "${LARCH_E2E_SCHEDULER:-1}" != 0 ]]; then
    start kube-scheduler \
      --kubeconfig="$DIR/kube-scheduler.kubeconfig" \
      --authentication-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
      --authorization-kubeconfig="$DIR/kube-scheduler.kubeconfig" \
      --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --cert-dir="$DIR/certs/scheduler" \
      --leader-elect=false \
      --profiling=false \
      --v="$VERBOSITY"
    wait_for kube-scheduler "kube-scheduler /healthz" \
      curl -fsSk --max-time 2 "https://127.0.0.1:$SCHEDULER_PORT/healthz"
  fi
  flock -u 9

  # The ServiceAccount admission plugin rejects pods until the namespace's `default`
  # ServiceAccount exists: wait for KCM's serviceaccount controller to make it in `default`.
  wait_for kube-controller-manager "ServiceAccount default/default" \
    curl_admin "$APISERVER_URL/api/v1/namespaces/default/serviceaccounts/default"

  log "cluster up in $((SECONDS - t_start))s: $APISERVER_URL, KUBECONFIG=$DIR/kubeconfig"
}

cmd_down() {
  [[ -d "$DIR" ]] || { log "$DIR does not exist, nothing to stop"; return 0; }
  stop_all
  log "cluster in $DIR stopped"
}

cmd_env() {
  [[ -f "$DIR/kubeconfig" ]] || die "no cluster in $DIR (no kubeconfig)"
  echo "export KUBECONFIG=$DIR/kubeconfig"
  echo "export PATH=$BIN:\$PATH"
}

cmd_status() {
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    if alive "$c"; then
      printf '%-24s pid %-8s %s\n' "$c" "$(pid_of "$c")" \
        "$(awk '/^VmRSS/ { r = $2 } /^VmHWM/ { h = $2 } END { printf "rss %d MiB (peak %d MiB)", r / 1024, h / 1024 }' "/proc/$(pid_of "$c")/status")"
    else
      printf '%-24s not running\n' "$c"; rc=1
    fi
  done
  if [[ -f "$DIR/cluster.env" ]]; then
    # shellcheck disable=SC1091
    . "$DIR/cluster.env"
    PKI="$DIR/pki"
    printf 'readyz: %s\n' "$(curl_admin "$LARCH_E2E_APISERVER_URL/readyz" 2>&1 || true)"
  fi
  return $rc
}

[[ $# -eq 2 ]] || usage
DIR="$2"
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
DIR="${DIR%/}"
[[ -n "$DIR" && "$DIR" != / ]] || die "refusing DIR=/"
case "$1" in
  up) mkdir -p "$DIR"; DIR="$(cd "$DIR" && pwd)"; cmd_up ;;
  down) cmd_down ;;
  env) cmd_env ;;
  status) cmd_status ;;
  *) usage ;;
esac
