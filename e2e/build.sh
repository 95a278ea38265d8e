#!/usr/bin/env bash
# Build the end-to-end test binaries from Go modules (no binary downloads):
#   larch-cp  (e2e/controlplane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl)
#   helm      (e2e/helm: the upstream helm v3 CLI)
#   larch-gitops (e2e/gitops: kstatus from sigs.k8s.io/cli-utils and Argo CD health Lua run in
#                 github.com/yuin/gopher-lua, what Flux and Argo CD compute)
#   larch-node (e2e/node: kubelet and kube-proxy of the same k8s.io/kubernetes as larch-cp; the
#               real node of e2e/realnode.sh; built only when named)
# into ${LARCH_CACHE:-$HOME/.cache/larch}/bin/, with GOMODCACHE and GOCACHE under ${LARCH_CACHE}/go/.
# A binary is rebuilt only when the sha256 of its module's go.mod + go.sum + *.go + the Go version
# differs from the stamp stored beside it. LARCH_E2E_FORCE_BUILD=1 forces a rebuild.
#
# usage: e2e/build.sh [larch-cp|helm|larch-gitops|larch-node]...     (default: the first three)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
LARCH_CACHE="${LARCH_CACHE:-$HOME/.cache/larch}"
export LARCH_CACHE
# Go 1.26: on PATH, /usr/local/go, or the toolchain scripts/setup.sh installs (scripts/go.sh)
go_bin="$(bash "$here/../scripts/go.sh" find)" || {
  echo "build.sh: no Go 1.26 toolchain found (PATH, /usr/local/go, \$LARCH_CACHE/go/toolchain): run scripts/setup.sh" >&2
  exit 1
}
export PATH="$(dirname "$go_bin"):$PATH"
bin="$LARCH_CACHE/bin"
export GOMODCACHE="$LARCH_CACHE/go/mod"
export GOCACHE="$LARCH_CACHE/go/build"
export GOTOOLCHAIN=local     # never try to download another toolchain
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0         # static binaries; nothing here needs cgo
mkdir -p "$bin" "$GOMODCACHE" "$GOCACHE"

gover="$(go env GOVERSION)"

# gomod_version MODDIR PATH -> the version of PATH in MODDIR/go.mod (replace target wins)
gomod_version() {
  (cd "$1" && go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' "$2")
}

stamp_of() { # MODDIR
  (cd "$1" && cat go.mod go.sum $(ls *.go 2>/dev/null | sort) && echo "$gover" && sed -n '/^ldflags_/,/^}/p' "$here/build.sh") | sha256sum | cut -d' ' -f1
}

ldflags_larch_cp() {
  local k8s; k8s="$(gomod_version "$here/controlplane" k8s.io/kubernetes)"
  local re='^v([0-9]+)\.([0-9]+)\.'
  [[ "$k8s" =~ $re ]]
  local v=k8s.io/component-base/version
  # the same -X the kubernetes build sets, so /version and `kubectl version` tell the truth
  echo "-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=${BASH_REMATCH[1]} -X $v.gitMinor=${BASH_REMATCH[2]}" \
       "-X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z" \
       "-X k8s.io/client-go/pkg/version.gitVersion=$k8s -X k8s.io/client-go/pkg/version.gitMajor=${BASH_REMATCH[1]} -X k8s.io/client-go/pkg/version.gitMinor=${BASH_REMATCH[2]}"
}

ldflags_helm() {
  local h; h="$(gomod_version "$here/helm" helm.sh/helm/v3)"
  local cg; cg="$(gomod_version "$here/helm" k8s.io/client-go)"
  local re='^v0\.([0-9]+)\.'
  [[ "$cg" =~ $re ]]
  local minor="${BASH_REMATCH[1]}"
  # as helm's Makefile: version + the Kubernetes version that `helm template` assumes
  echo "-s -w -X helm.sh/helm/v3/internal/version.version=$h -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
       "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor" \
       "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
}

build_one() { # NAME MODDIR PACKAGE LDFLAGS_FN
  local name="$1" mod="$2" pkg="$3" ldf="$4"
  local stamp; stamp="$(stamp_of "$mod")"
  local stampfile="$bin/.$name.stamp"
  if [[ "${LARCH_E2E_FORCE_BUILD:-0}" != 1 && -x "$bin/$name" && -f "$stampfile" && "$(cat "$stampfile")" == "$stamp" ]]; then
    echo "build.sh: $name up to date ($bin/$name)"
    return 0
  fi
  echo "build.sh: building $name with $gover (GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE) ..."
  local t0=$SECONDS
  (cd "$mod" && go mod download)
  local t1=$SECONDS
  (cd "$mod" && go build -trimpath -ldflags "$($ldf)" -o "$bin/.$name.tmp" "$pkg")
  mv -f "$bin/.$name.tmp" "$bin/$name"
  echo "$stamp" > "$stampfile"
  echo "build.sh: $name built in $((SECONDS - t0))s (download $((t1 - t0))s, compile+link $((SECONDS - t1))s), $(du -h "$bin/$name" | cut -f1)"
}

# not named ldflags_*: the stamps hash those functions, and a new one would rebuild larch-cp
gitops_ldflags() { echo "-s -w"; }   # library versions: the build info (larch-gitops version)
# larch-node: the version stamps of larch-cp (node_gomod_check: the same k8s.io/kubernetes)
node_ldflags() { ldflags_larch_cp; }

# e2e/node/go.mod must pin the k8s.io/kubernetes version and replace block of
# e2e/controlplane/go.mod (e2e/node/sync-gomod.sh writes it so): one Kubernetes release per cluster.
node_gomod_check() {
  local a b
  a=$(gomod_version "$here/controlplane" k8s.io/kubernetes) b=$(gomod_version "$here/node" k8s.io/kubernetes)
  [[ "$a" == "$b" ]] || { echo "build.sh: e2e/node pins k8s.io/kubernetes $b, e2e/controlplane $a: run e2e/node/sync-gomod.sh" >&2; exit 1; }
  a=$(sed -n '/^\/\/ Generated by gen-replaces.sh/,/^)/p' "$here/controlplane/go.mod")
  b=$(sed -n '/^\/\/ Generated by gen-replaces.sh/,/^)/p' "$here/node/go.mod")
  [[ -n "$a" && "$a" == "$b" ]] || { echo "build.sh: e2e/node/go.mod's replace block differs from e2e/controlplane's: run e2e/node/sync-gomod.sh" >&2; exit 1; }
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(larch-cp helm larch-gitops)
start=$SECONDS
for t in "${targets[@]}"; do
  case "$t" in
    larch-cp)
      build_one larch-cp "$here/controlplane" . ldflags_larch_cp
      ln -sfn larch-cp "$bin/kubectl"   # `kubectl` on PATH for scripts and helm-less use
      ;;
    helm) build_one helm "$here/helm" helm.sh/helm/v3/cmd/helm ldflags_helm ;;
    larch-gitops) build_one larch-gitops "$here/gitops" . gitops_ldflags ;;
    larch-node)
      node_gomod_check
      build_one larch-node "$here/node" . node_ldflags
      ;;
    *) echo "build.sh: unknown target $t (larch-cp|helm|larch-gitops|larch-node)" >&2; exit 2 ;;
  esac
done
echo "build.sh: done in $((SECONDS - start))s; binaries in $bin"
