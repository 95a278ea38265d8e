#!/usr/bin/env bash
# Prints examples/*.yaml adapted to a local environment of e2e/env.sh, as JSON documents ready for
# `kubectl apply -f -`; creates the S3 buckets they name on the environment's SeaweedFS.
#
#   e2e/examples.sh ENV_DIR [NAMESPACE]
#
# No kustomize: the examples are converted to JSON by `kubectl create --dry-run=client` and
# adapted with a few lines of Python, only where an example necessarily differs from a real
# cluster:
# - the Secrets the examples reference by name keep their names and keys; their values become the
#   test PostgreSQL's DSN (pg-source/dsn; pg-staging/dsn, the restore example's target, is the
#   server's `postgres` database, where the restore completes) and an S3 key pair
#   (s3-credentials; SeaweedFS accepts any);
# - every S3 location gets the environment's endpoint, path-style addressing and the
#   s3-credentials Secret (the fake kubelet's pods have no cloud identity); a CA bundle is dropped
#   (SeaweedFS speaks plain HTTP here);
# - exported tables become public.events (the sample table) and index fields name its columns;
# - a ServiceAccount an example names (created by the platform team on a real cluster) is added.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:?usage: e2e/examples.sh ENV_DIR [NAMESPACE]}
ns=${2:-default}
# shellcheck disable=SC1091
. "$dir/env"

"$KUBECTL" create --dry-run=client -o json -n "$ns" -f "$here/examples/" |
  LARCH_E2E_NS="$ns" LARCH_E2E_PG_DSN="$LARCH_E2E_PG_DSN" LARCH_E2E_S3_ENDPOINT="$LARCH_E2E_S3_ENDPOINT" \
  python3 -c '
import json, os, subprocess, sys
text = sys.stdin.read()
dec = json.JSONDecoder()
objs, i = [], 0
while True:
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    o, i = dec.raw_decode(text, i)
    objs.extend(o["items"] if o.get("kind") == "List" else [o])

ns = os.environ["LARCH_E2E_NS"]
endpoint = os.environ["LARCH_E2E_S3_ENDPOINT"]
buckets, accounts, out = set(), set(), []

def staging_dsn():
    # The restore example restores into the `postgres` database, which every
    # PostgreSQL has and where public.events does not exist: its `ifExists: Fail` passes and
    # the restore completes (in a second namespace it then refuses the existing table, changing nothing).
    return os.environ["LARCH_E2E_PG_DSN"].replace("dbname=app", "dbname=postgres")

def s3(loc):
    loc["endpoint"] = endpoint
    loc["pathStyle"] = True
    loc["credentials"] = {"secretRef": {"name": "s3-credentials"}}
    loc.pop("caBundle", None)
    buckets.add(loc["bucket"])

for o in objs:
    o["metadata"]["namespace"] = ns
    kind, spec = o["kind"], o.get("spec", {})
    if kind == "Secret" and o["metadata"]["name"] == "pg-source":
        o["stringData"] = {"dsn": os.environ["LARCH_E2E_PG_DSN"]}
    elif kind == "Secret" and o["metadata"]["name"] == "pg-staging":
        o["stringData"] = {"dsn": staging_dsn()}
    elif kind == "Secret" and o["metadata"]["name"] == "s3-credentials":
        o["stringData"] = {"AWS_ACCESS_KEY_ID": "larch-e2e", "AWS_SECRET_ACCESS_KEY": "larch-e2e-secret"}
    elif kind == "ArchiveExport":
        if "s3" in spec["destination"]:
            s3(spec["destination"]["s3"])
        spec["source"]["table"] = {"schema": "public", "name": "events"}
        spec["source"].pop("tables", None)
    elif kind == "ArchiveSource":
        if "s3" in spec["archive"]:
            s3(spec["archive"]["s3"])
        mem = spec.get("target", {}).get("memory")
        if mem and "indexFields" in mem:
            mem["indexFields"] = ["tenant" if f == "tenant_id" else f for f in mem["indexFields"]]
    if kind in ("ArchiveExport", "ArchiveSource") and spec.get("serviceAccountName"):
        accounts.add(spec["serviceAccountName"])
    out.append(o)
for a in sorted(accounts):
    out.insert(0, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": a, "namespace": ns}})
for b in sorted(buckets):
    code = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", f"{endpoint}/{b}"],
                          capture_output=True, text=True, check=True).stdout
    if code not in ("200", "409"):
        sys.exit(f"creating bucket {b}: HTTP {code}")
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": out}, indent=1))
'
