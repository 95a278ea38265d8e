#!/usr/bin/env bash
# A real Kubernetes node for larch's end-to-end tests and the demo: the control plane of
# e2e/cluster.sh, PostgreSQL 15, SeaweedFS, containerd + runc (Debian), the CNI bridge with
# host-local IPAM (Debian containernetworking-plugins), and the kubelet and kube-proxy of
# larch-node (e2e/node: the same k8s.io/kubernetes module, version and replace block as larch-cp).
# Pods run the larch image (scripts/image.sh) imported into containerd; the pause image is built
# here from Kubernetes' own pause.c.
#
#   e2e/realnode.sh setup        install the Debian packages it needs (idempotent)
#   e2e/realnode.sh up DIR       start everything under DIR; writes DIR/env (below)
#   e2e/realnode.sh down DIR     stop everything started under DIR, remove its network namespace,
#                                cgroups, mounts and DIR
#   e2e/realnode.sh exec DIR CMD run CMD inside the node's network namespace
#
# Network: everything runs in one network namespace the script creates (`larch-node-<hash>`),
# with loopback (127.0.0.1 and the node's address 10.89.0.1/32), the default route to larch0, a
# bridge without ports (nothing sent there arrives anywhere; no interface of the namespace leads
# out of it anyway), the CNI bridge cni0 (10.88.0.1/24) and the pods' veths. Pod netns are created by this containerd under DIR
# (netns_mounts_under_state_dir). Service ClusterIPs (10.0.0.0/24) are kube-proxy's iptables rules
# in that namespace. The host's network is never touched; KUBECONFIG's server is 127.0.0.1 of the
# namespace, so use the wrappers DIR/bin/{kubectl,helm,curl,psql} (or `exec`).
#
# Environment of `up`:
#   LARCH_IMAGE        the image the pods run (default localhost/larch:dev; built by
#                      scripts/image.sh, with LARCH_BIN, when podman does not have it)
#   LARCH_SAMPLE_ROWS  rows of app.public.events (default 2000)
#
# DIR/env afterwards: KUBECONFIG, KUBECTL, HELM, CURL, PSQL (wrappers entering the namespace),
# LARCH_E2E_NETNS, LARCH_E2E_NODE_IP, LARCH_E2E_PG_PORT, LARCH_E2E_PG_DSN,
# LARCH_E2E_S3_ENDPOINT (what pods use: the node's address), LARCH_E2E_IMAGE.
set -Eeuo pipefail
trap 'echo "realnode.sh: line $LINENO failed (exit $?): $BASH_COMMAND" >&2' ERR
here=$(cd "$(dirname "$0")/.." && pwd)
export LARCH_CACHE=${LARCH_CACHE:-$HOME/.cache/larch}
BIN=$LARCH_CACHE/bin
NODE_IP=10.89.0.1
POD_CIDR=10.88.0.0/16
POD_SUBNET=10.88.0.0/24
NODE_NAME=larch-node
PAUSE_IMAGE=localhost/larch/pause:3.10.2
IMAGE=${LARCH_IMAGE:-localhost/larch:dev}

die() { echo "realnode.sh: $*" >&2; exit 1; }
log() { echo "realnode.sh: $*" >&2; }

# --------------------------------------------------------------------------------------------
cmd_setup() {
  local pkgs=() p
  for p in containerd runc containernetworking-plugins iptables conntrack iproute2 podman \
           util-linux openssl curl python3-yaml gcc libc6-dev; do
    [[ "$(dpkg-query -W -f '${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || pkgs+=("$p")
  done
  if ((${#pkgs[@]})); then
    log "installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${pkgs[@]}" >/dev/null
  fi
  # Debian starts containerd as a service on install: this script runs its own, under DIR.
  if command -v systemctl >/dev/null && systemctl is-active -q containerd 2>/dev/null; then
    systemctl disable --now containerd >/dev/null 2>&1 || true
  fi
}

# --------------------------------------------------------------------------------------------
setvars() {
  dir=$1
  [[ "$dir" == /* ]] || dir="$PWD/$dir"
  dir=${dir%/}
  [[ -n "$dir" && "$dir" != / ]] || die "refusing DIR=/"
  hash=$(echo -n "$dir" | sha256sum | cut -c1-8)
  NS=larch-node-$hash
  pgdir=/var/tmp/larch-node-pg-$hash         # the postgres user cannot traverse /root
  CGROOT=larch-node-$hash                    # the kubelet's --cgroup-root, in every hierarchy
  CTRD=$dir/containerd
  SOCK=$CTRD/containerd.sock
}

in_ns() { nsenter --net="/run/netns/$NS" -- "$@"; }

# private_tmp DIR CMD...: CMD in a mount namespace of its own where DIR is mounted on /tmp
private_tmp() {
  local d=$1; shift
  unshare --mount --propagation private -- bash -c 'mount --bind "$1" /tmp && shift && exec "$@"' _ "$d" "$@"
}

# start NAME CMD...: a daemon in the namespace, own session, pid in DIR/run/NAME.pid
start() {
  local name=$1; shift
  setsid nsenter --net="/run/netns/$NS" -- "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/run/$name.pid"
}

alive() { local f="$dir/run/$1.pid"; [[ -f "$f" ]] && kill -0 "$(cat "$f")" 2>/dev/null; }

stop() { # NAME [SECONDS]
  local f="$dir/run/$1.pid" pid
  [[ -f "$f" ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $((${2:-10} * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

wait_until() { # SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2 t0=$SECONDS; shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - t0 < limit)) || return 1
    sleep 0.5
  done
  log "$what ($((SECONDS - t0))s)"
}

fail() { # NAME...: show the logs, tear down, exit
  local n
  for n in "$@"; do
    [[ -f "$dir/logs/$n.log" ]] && { echo "----- last lines of $dir/logs/$n.log" >&2; tail -n 30 "$dir/logs/$n.log" >&2; }
  done
  die "up failed; run: $0 down $dir"
}

# --------------------------------------------------------------------------------------------
# PKI of the node: client certificates signed by the cluster's CA (cluster.sh's pki/)
node_pki() {
  local pki=$dir/cluster/pki
  (
    cd "$dir/pki"
    umask 077
    leaf() { # NAME SUBJECT EXT
      openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -sha256 -days 365 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    local client="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
    leaf kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
    leaf kube-proxy "/CN=system:kube-proxy" "$client"
    leaf kubelet-serving "/CN=$NODE_NAME" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME"
  )
}

kubeconfig() { # FILE CERT
  local b64; b64() { base64 -w0 <"$1"; }
  (umask 077; cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: larch-e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(b64 "$dir/cluster/pki/ca.crt")
users:
- name: node
  user:
    client-certificate-data: $(b64 "$dir/pki/$2.crt")
    client-key-data: $(b64 "$dir/pki/$2.key")
contexts:
- name: larch-e2e
  context: {cluster: larch-e2e, user: node}
current-context: larch-e2e
EOF
  )
}

# --------------------------------------------------------------------------------------------
# The pause image: Kubernetes' build/pause/linux/pause.c from the k8s.io/kubernetes module
# larch-node is built from, linked statically, in an image of its own.
pause_image() {
  local src k8s
  # (awk reads the file itself: `sed | awk '...exit'` can kill sed with SIGPIPE, fatal with pipefail)
  k8s=$(awk '{ sub(/^require[ \t]*/, "") } $1 == "k8s.io/kubernetes" { print $2; exit }' "$here/e2e/node/go.mod")
  src="$LARCH_CACHE/go/mod/k8s.io/kubernetes@$k8s/build/pause/linux/pause.c"
  [[ -f "$src" ]] || die "no $src (e2e/build.sh larch-node downloads the module)"
  local out="$LARCH_CACHE/image/pause"
  local stamp; stamp=$( (cat "$src"; echo "$PAUSE_IMAGE"; gcc -dumpfullversion) | sha256sum | cut -c1-16)
  if [[ -f "$out/pause.tar" && "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
    return 0
  fi
  mkdir -p "$out"
  gcc -Os -Wall -Werror -static -DVERSION="\"${PAUSE_IMAGE##*:}-larch\"" -o "$out/pause" "$src"
  strip "$out/pause"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$out/Containerfile"
  CONTAINERS_CONF=$(containers_conf) podman build -q --network none -f "$out/Containerfile" -t "$PAUSE_IMAGE" "$out" >/dev/null
  rm -f "$out/pause.tar"
  CONTAINERS_CONF=$(containers_conf) podman save -q --format docker-archive -o "$out/pause.tar" "$PAUSE_IMAGE"
  echo "$stamp" >"$out/stamp"
  log "pause image $PAUSE_IMAGE built from $src"
}

containers_conf() {
  local f="$LARCH_CACHE/image/containers.conf"
  mkdir -p "$(dirname "$f")"
  printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' >"$f"
  echo "$f"
}

# --------------------------------------------------------------------------------------------
cmd_up() {
  [[ ! -e "$dir/env" ]] || die "$dir already holds a node; run: $0 down $dir"
  [[ "$dir/" != /tmp/* ]] || die "DIR must not be under /tmp; use /var/tmp"
  [[ ! -e "/run/netns/$NS" ]] || die "network namespace $NS exists; run: $0 down $dir"
  cmd_setup
  [[ -x "$BIN/larch-cp" && -x "$BIN/larch-node" && -x "$BIN/helm" ]] || bash "$here/e2e/build.sh" larch-cp larch-node helm >&2
  export CONTAINERS_CONF; CONTAINERS_CONF=$(containers_conf)
  podman image exists "$IMAGE" || LARCH_IMAGE=$IMAGE bash "$here/scripts/image.sh" build
  pause_image
  mkdir -p "$dir"/{logs,run,pki,bin,cni/net.d,cni/networks,kubelet,pod-logs} "$CTRD"
  local t0=$SECONDS

  # ---- the network namespace
  ip netns add "$NS"
  in_ns ip link set lo up
  in_ns ip addr add "$NODE_IP/32" dev lo    # the node's address (the kernel has no dummy device)
  # The default route: a bridge with no ports (what is sent there reaches nothing). Not a
  # blackhole route: connect() to a Service's ClusterIP from the node needs a route before
  # kube-proxy's nat OUTPUT rule rewrites the destination (a blackhole fails it with EINVAL).
  in_ns ip link add larch0 type bridge
  in_ns ip link set larch0 up
  in_ns ip route add default dev larch0
  in_ns sysctl -qw net.ipv4.ip_forward=1
  in_ns sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  log "network namespace $NS: lo with 127.0.0.1 and the node's $NODE_IP, default route to larch0 (a bridge without ports)"

  # ---- control plane, PostgreSQL, SeaweedFS: inside the namespace
  in_ns env LARCH_E2E_NODE_IP=$NODE_IP bash "$here/e2e/cluster.sh" up "$dir/cluster" >"$dir/logs/cluster.log" 2>&1 \
    || { cat "$dir/logs/cluster.log" >&2; die "control plane did not start"; }
  # shellcheck disable=SC1091
  . "$dir/cluster/cluster.env"
  APISERVER_PORT=$LARCH_E2E_APISERVER_PORT
  log "control plane up in $NS ($((SECONDS - t0))s)"
  local pg_port=55432 s3_port=8333
  in_ns env LARCH_PG_LISTEN="127.0.0.1,$NODE_IP" LARCH_PG_TRUST_CIDR=$POD_CIDR \
    bash "$here/scripts/postgres.sh" start "$pgdir" "$pg_port"
  local psql=/usr/lib/postgresql/15/bin/psql
  in_ns "$psql" -q -h 127.0.0.1 -p $pg_port -U postgres -d postgres -c "CREATE DATABASE app" >/dev/null
  in_ns env PGOPTIONS="-c client_min_messages=warning" "$psql" -q -h 127.0.0.1 -p $pg_port -U postgres -d app \
    -v rows="${LARCH_SAMPLE_ROWS:-2000}" -f "$here/scripts/sample/events.sql" >/dev/null
  # weed names unix sockets /tmp/seaweedfs-<component>-<port>.sock: ports free in this namespace
  # may be another SeaweedFS's on the host, so this one gets a /tmp of its own (private_tmp)
  mkdir -p "$dir/s3/tmp"
  private_tmp "$dir/s3/tmp" nsenter --net="/run/netns/$NS" -- env LARCH_S3_BIND=0.0.0.0 bash "$here/scripts/seaweedfs.sh" start "$dir/s3" $s3_port >/dev/null
  log "PostgreSQL $NODE_IP:$pg_port, SeaweedFS http://$NODE_IP:$s3_port ($((SECONDS - t0))s)"

  # ---- containerd (its own root, state and socket under DIR; CNI bridge + host-local)
  cat >"$dir/cni/net.d/10-larch.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "larch",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/networks",
              "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "10.88.0.1"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
EOF
  cat >"$CTRD/config.toml" <<EOF
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = "$CTRD/debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  # this machine's root lacks CAP_SYS_RESOURCE (CapEff 000001fffeffffff: bit 24 is clear), so a
  # negative oom_score_adj (the sandbox's -998) is refused and runc create fails ("can't get
  # final child's PID from pipe: EOF"): clamp it to containerd's own, as rootless setups do
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
  start containerd containerd --config "$CTRD/config.toml"
  wait_until 60 "containerd up" ctr -a "$SOCK" version || fail containerd
  ctr -a "$SOCK" -n k8s.io images import -q --no-unpack "$LARCH_CACHE/image/pause/pause.tar" >/dev/null 2>&1 \
    || ctr -a "$SOCK" -n k8s.io images import "$LARCH_CACHE/image/pause/pause.tar" >/dev/null
  podman save -q --format docker-archive -o "$dir/image.tar" "$IMAGE"
  ctr -a "$SOCK" -n k8s.io images import "$dir/image.tar" >/dev/null
  rm -f "$dir/image.tar"
  log "containerd: images $(ctr -a "$SOCK" -n k8s.io images ls -q | grep -v '^sha256:' | tr '\n' ' ')($((SECONDS - t0))s)"

  # ---- kubelet and kube-proxy
  node_pki
  kubeconfig "$dir/kubelet.kubeconfig" kubelet
  kubeconfig "$dir/kube-proxy.kubeconfig" kube-proxy
  local c
  for c in /sys/fs/cgroup/*/; do
    [[ -d "$c" && ! -L "${c%/}" && "$c" != */unified/ ]] && mkdir -p "$c$CGROOT"
  done
  printf 'nameserver 127.0.0.1\n' >"$dir/resolv.conf"   # pods get it; no DNS answers there
  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $dir/pki/kubelet-serving.crt
tlsPrivateKeyFile: $dir/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $dir/cluster/pki/ca.crt}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupRoot: /$CGROOT
failCgroupV1: false
failSwapOn: false
resolvConf: $dir/resolv.conf
clusterDomain: cluster.local
podLogsDir: $dir/pod-logs
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
maxPods: 60
EOF
  start kubelet "$BIN/larch-node" kubelet --config="$dir/kubelet.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
    --root-dir="$dir/kubelet" --cert-dir="$dir/pki" --hostname-override=$NODE_NAME --node-ip=$NODE_IP \
    --v="${LARCH_E2E_V:-1}"
  cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
  start kube-proxy "$BIN/larch-node" kube-proxy --config="$dir/kube-proxy.yaml" --v="${LARCH_E2E_V:-1}"

  # ---- wrappers and env
  local kc=$dir/cluster/kubeconfig
  printf '#!/bin/sh\nexec nsenter --net=/run/netns/%s -- %s kubectl --kubeconfig %s "$@"\n' "$NS" "$BIN/larch-cp" "$kc" >"$dir/bin/kubectl"
  printf '#!/bin/sh\nexec nsenter --net=/run/netns/%s -- %s --kubeconfig %s "$@"\n' "$NS" "$BIN/helm" "$kc" >"$dir/bin/helm"
  printf '#!/bin/sh\nexec nsenter --net=/run/netns/%s -- curl "$@"\n' "$NS" >"$dir/bin/curl"
  printf '#!/bin/sh\nexec nsenter --net=/run/netns/%s -- %s -h 127.0.0.1 -p %s -U postgres "$@"\n' "$NS" "$psql" "$pg_port" >"$dir/bin/psql"
  chmod 755 "$dir"/bin/*
  cat >"$dir/env" <<EOF
export KUBECONFIG=$kc
KUBECTL=$dir/bin/kubectl
HELM=$dir/bin/helm
CURL=$dir/bin/curl
PSQL=$dir/bin/psql
LARCH_E2E_NETNS=$NS
LARCH_E2E_NODE_IP=$NODE_IP
LARCH_E2E_PG_PORT=$pg_port
LARCH_E2E_PG_DIR=$pgdir
LARCH_E2E_PG_DSN='host=$NODE_IP port=$pg_port user=postgres dbname=app'
LARCH_E2E_S3_ENDPOINT=http://$NODE_IP:$s3_port
LARCH_E2E_IMAGE=$IMAGE
EOF
  wait_until 120 "node $NODE_NAME Ready" \
    bash -c '"$1" get node "$2" -o jsonpath="{.status.conditions[?(@.type==\"Ready\")].status}" | grep -q True' _ "$dir/bin/kubectl" $NODE_NAME \
    || fail containerd kubelet kube-proxy
  alive kube-proxy || fail kube-proxy
  log "node up in $((SECONDS - t0))s: . $dir/env"
}

# --------------------------------------------------------------------------------------------
cmd_down() {
  [[ -d "$dir" || -e "/run/netns/$NS" ]] || { log "$dir: nothing to stop"; return 0; }
  local t0=$SECONDS
  # The node's daemons first, then every container containerd still runs (killed and deleted
  # with ctr); the pods' veths, the bridge and the iptables rules go with the namespace, their
  # netns and volume mounts are unmounted under DIR, their addresses were allocated under DIR.
  stop kube-proxy
  stop kubelet
  local ids="" id
  if alive containerd; then
    ids=$(ctr -a "$SOCK" -n k8s.io containers ls -q 2>/dev/null || true)   # sandboxes too
    for id in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$SOCK" -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1 || true
    done
    sleep 1
    for id in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$SOCK" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr -a "$SOCK" -n k8s.io containers ls -q 2>/dev/null); do
      ctr -a "$SOCK" -n k8s.io containers delete "$id" >/dev/null 2>&1 || true
    done
  fi
  stop containerd 15
  # shims this containerd started (their command line names its socket)
  local p
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null || true); do
    kill -KILL "$p" 2>/dev/null || true
  done
  [[ -d "$dir/cluster" ]] && in_ns bash "$here/e2e/cluster.sh" down "$dir/cluster" >/dev/null 2>&1 || true
  [[ -d "$dir/s3" ]] && private_tmp "$dir/s3/tmp" nsenter --net="/run/netns/$NS" -- bash "$here/scripts/seaweedfs.sh" stop "$dir/s3" >/dev/null 2>&1 || true
  [[ -d "$pgdir" ]] && in_ns bash "$here/scripts/postgres.sh" stop "$pgdir" >/dev/null 2>&1 || true
  # mounts under DIR (pod volumes, overlay rootfs, pod netns), deepest first
  local m
  for m in $(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # cgroups the kubelet made, deepest first (empty once every process is gone)
  local c
  for c in /sys/fs/cgroup/*/"$CGROOT"; do
    [[ -d "$c" ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # what CNI (libcni, under containerd) cached of each sandbox's network: /var/lib/cni/results,
  # fixed in containerd 1.6; no CNI DEL ran for them
  for id in $ids; do rm -f /var/lib/cni/results/*-"$id"-*; done
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  rmdir /run/containerd/fifo /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd/s /run/containerd 2>/dev/null || true
  # the kubelet's links to its containers' logs (/var/log/containers is fixed in the kubelet)
  local l
  for l in /var/log/containers/*.log; do
    [[ -L "$l" && "$(readlink "$l")" == "$dir/"* ]] && rm -f "$l"
  done
  rmdir /var/log/containers 2>/dev/null || true
  ip netns delete "$NS" 2>/dev/null || true
  rm -rf "$pgdir" "$dir"
  log "stopped and removed $dir ($((SECONDS - t0))s)"
}

case "${1:-}" in
  setup) cmd_setup ;;
  up) [[ $# -eq 2 ]] || die "usage: $0 up DIR"; setvars "$2"; cmd_up ;;
  down) [[ $# -eq 2 ]] || die "usage: $0 down DIR"; setvars "$2"; cmd_down ;;
  exec) [[ $# -ge 3 ]] || die "usage: $0 exec DIR CMD..."; setvars "$2"; shift 2; in_ns "$@" ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
