#!/usr/bin/env bash
# What can be checked here of .github/workflows/release.yml (it runs only on GitHub, on a tag):
#   - the workflow parses as YAML and has the expected shape (a tag trigger; binaries for amd64 and
#     arm64; the image built from them by the Dockerfile's `prebuilt` target for linux/amd64 and
#     linux/arm64 and pushed to IMAGE_REPOSITORY; the chart packaged by scripts/chart-package.sh
#     with the image's digest);
#   - the image it publishes (env IMAGE_REPOSITORY) is the chart's default image
#     (charts/larch/values.yaml image.repository);
#   - scripts/chart-package.sh packages the chart (`helm package`), and the packaged chart's
#     operator Deployment runs IMAGE_REPOSITORY:VERSION@DIGEST, also as the generated pods' image.
# Needs python3 with PyYAML (python3-yaml) and helm ($LARCH_CACHE/bin/helm from e2e/build.sh, or HELM).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
LARCH_CACHE=${LARCH_CACHE:-$HOME/.cache/larch}
export HELM=${HELM:-$LARCH_CACHE/bin/helm}
[[ -x "$HELM" ]] || HELM=$(command -v helm) || { echo "release-check: no helm (run e2e/build.sh helm)" >&2; exit 1; }
py=python3
if ! $py -c 'import yaml' 2>/dev/null; then   # Debian's python3 with Debian's PyYAML
  py=/usr/bin/python3
  $py -c 'import yaml' 2>/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-yaml >/dev/null
fi

image=$($py - "$here" <<'PY'
import sys, yaml, re
root = sys.argv[1]
wf = yaml.safe_load(open(f"{root}/.github/workflows/release.yml"))
values = yaml.safe_load(open(f"{root}/charts/larch/values.yaml"))
def fail(msg):
    sys.exit(f"release-check: {msg}")
on = wf.get("on", wf.get(True))          # YAML 1.1 reads a bare `on` key as true
tags = on["push"]["tags"]
if not tags or not all(t.startswith("v") for t in tags):
    fail(f"the workflow should run on v* tags, runs on {tags}")
repo = wf["env"]["IMAGE_REPOSITORY"]
chart_repo = values["image"]["repository"]
if repo != chart_repo:
    fail(f"the workflow publishes {repo}, the chart's default image is {chart_repo}")
jobs = wf["jobs"]
arches = sorted(i["arch"] for i in jobs["binaries"]["strategy"]["matrix"]["include"])
if arches != ["amd64", "arm64"]:
    fail(f"binaries for {arches}, expected amd64 and arm64")
build = [s for s in jobs["image"]["steps"] if s.get("uses", "").startswith("docker/build-push-action")]
if len(build) != 1:
    fail("the image job has no docker/build-push-action step")
w = build[0]["with"]
if w.get("target") != "prebuilt" or w.get("file") != "Dockerfile" or not w.get("push"):
    fail(f"the image step should push the Dockerfile's prebuilt target: {w}")
if sorted(p.strip() for p in w["platforms"].split(",")) != ["linux/amd64", "linux/arm64"]:
    fail(f"platforms {w['platforms']}")
if not w["tags"].startswith("${{ env.IMAGE_REPOSITORY }}:"):
    fail(f"the image is tagged {w['tags']}, not in IMAGE_REPOSITORY")
if "steps.build.outputs.digest" not in jobs["image"]["outputs"]["digest"]:
    fail("the image job does not output the pushed digest")
runs = "\n".join(s.get("run", "") for s in jobs["chart"]["steps"])
if "scripts/chart-package.sh" not in runs or "needs.image.outputs.digest" not in runs:
    fail("the chart job does not package with scripts/chart-package.sh and the image's digest")
dockerfile = open(f"{root}/Dockerfile").read()
if not re.search(r"^FROM \S+ AS prebuilt$", dockerfile, re.M) or "larch-${TARGETARCH}" not in dockerfile:
    fail("the Dockerfile has no prebuilt target copying larch-${TARGETARCH}")
print(repo)
PY
)
echo "release-check: the workflow parses; it publishes $image, the chart's default image"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
digest=sha256:$(printf 'release-check' | sha256sum | cut -d' ' -f1)
bash "$here/scripts/chart-package.sh" 9.8.7-check "$digest" "$tmp" >/dev/null
[[ -f "$tmp/larch-9.8.7-check.tgz" ]] || { echo "release-check: helm package wrote no larch-9.8.7-check.tgz" >&2; exit 1; }
"$HELM" lint "$tmp/larch-9.8.7-check.tgz" >/dev/null
want="$image:9.8.7-check@$digest"
rendered=$("$HELM" template larch "$tmp/larch-9.8.7-check.tgz" --namespace larch-system)
got=$($py -c '
import sys, yaml
for d in yaml.safe_load_all(sys.stdin):
    if d and d.get("kind") == "Deployment":
        c = d["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        print(c["image"], env.get("LARCH_IMAGE", "-"))
' <<<"$rendered")
[[ "$got" == "$want $want" ]] || { echo "release-check: the packaged chart runs '$got', expected '$want' (operator and LARCH_IMAGE)" >&2; exit 1; }
echo "release-check: helm package ok; the packaged chart's operator and generated pods run $want"
