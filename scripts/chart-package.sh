#!/usr/bin/env bash
# Package charts/larch for a release: the chart's version and appVersion become VERSION, its
# default image the one the release published (image.tag VERSION, image.digest DIGEST), then
# `helm package` into OUTDIR. The repository stays charts/larch/values.yaml's image.repository,
# which .github/workflows/release.yml publishes to (scripts/release-check.sh checks both agree).
#
# usage: scripts/chart-package.sh VERSION [sha256:DIGEST] OUTDIR     (HELM: helm binary, default helm on PATH)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if (($# == 2)); then version=$1 digest="" out=$2
elif (($# == 3)); then version=$1 digest=$2 out=$3
else echo "usage: $0 VERSION [sha256:DIGEST] OUTDIR" >&2; exit 2; fi
helm=${HELM:-helm}
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || { echo "chart-package: '$version' is not a SemVer version (no leading v)" >&2; exit 2; }
[[ -z "$digest" || "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "chart-package: bad digest '$digest'" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -a "$here/charts/larch" "$tmp/larch"
c="$tmp/larch/Chart.yaml" v="$tmp/larch/values.yaml"
sed -i -E "s/^version: .*/version: $version/; s/^appVersion: .*/appVersion: \"$version\"/" "$c"
# image.tag and image.digest: the two lines under `image:` (values.yaml keeps them there)
sed -i -E "/^image:/,/^[^ #]/{s/^  tag: .*/  tag: \"$version\"/; s/^  digest: .*/  digest: \"$digest\"/}" "$v"
grep -q "^version: $version\$" "$c" && grep -q "^  tag: \"$version\"\$" "$v" && grep -q "^  digest: \"$digest\"\$" "$v" \
  || { echo "chart-package: could not set the version, tag or digest" >&2; exit 1; }
mkdir -p "$out"
"$helm" package "$tmp/larch" --destination "$out"
