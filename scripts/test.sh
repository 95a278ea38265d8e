#!/usr/bin/env bash
# The test command: installs what is missing, then runs format and lint checks, unit,
# integration (real PostgreSQL 15 and SeaweedFS) and end-to-end tests (tests/e2e: a real control
# plane from e2e/build.sh, the fake kubelet, the operator installed by helm), then the container
# image (podman) and the scenarios on a real node (kubelet, containerd, runc: e2e/realnode-test.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/setup.sh
export LARCH_CACHE=${LARCH_CACHE:-$HOME/.cache/larch}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$LARCH_CACHE/target}
export PATH="$LARCH_CACHE/venv/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The crash-safety tests and crash points exist with the feature only: lint them too.
cargo clippy --workspace --all-targets --locked --features crashpoints -- -D warnings
echo "== fake kubelet (e2e/fake-kubelet): fmt, clippy, unit tests"
cargo fmt --manifest-path e2e/fake-kubelet/Cargo.toml --all -- --check
cargo clippy --manifest-path e2e/fake-kubelet/Cargo.toml --all-targets --locked -- -D warnings
cargo test --manifest-path e2e/fake-kubelet/Cargo.toml --locked
echo "== e2e/build.sh (larch-cp, helm: ~16 min cold; larch-gitops: seconds; then cached under $LARCH_CACHE/bin)"
bash e2e/build.sh
echo "== e2e/gitops (larch-gitops): go vet, go test"
(cd e2e/gitops && export PATH="$(dirname "$(bash ../../scripts/go.sh find)"):$PATH" \
   GOMODCACHE="$LARCH_CACHE/go/mod" GOCACHE="$LARCH_CACHE/go/build" GOTOOLCHAIN=local \
   GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0 && go vet ./... && go test ./...)
echo "== the release workflow (scripts/release-check.sh: YAML, the published image = the chart's, helm package)"
bash scripts/release-check.sh
echo "== cargo test (unit, integration with the crash points, end-to-end: tests/e2e)"
cargo test --workspace --locked --all-targets --features crashpoints
echo "== the image and the real node (scripts/image.sh, e2e/realnode-test.sh: ~2 min, budget 20 min)"
# the debug binary cargo test just built, in the image localhost/larch:test on the substitute
# distroless base; then a real kubelet (containerd + runc) runs it in a network namespace of its own
bash e2e/realnode.sh setup
bash e2e/build.sh larch-node
export LARCH_IMAGE=localhost/larch:test LARCH_BIN=$CARGO_TARGET_DIR/debug/larch
bash scripts/image.sh build
bash scripts/image.sh test
LARCH_REALNODE_BUDGET=1200 bash e2e/realnode-test.sh
