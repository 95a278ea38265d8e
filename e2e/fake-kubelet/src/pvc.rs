//! Acting as the volume provisioner: every PersistentVolumeClaim that is not bound gets a
//! hostPath PersistentVolume under `--data-dir/pv/<name>`, pre-bound to the claim (`claimRef` with
//! the claim's uid), and the claim is bound to it (`spec.volumeName`, the annotations the PV
//! controller writes, status Bound) — consistent with what kube-controller-manager's PV binder
//! expects, so it leaves them alone. PVs this created are deleted (with their directory) once
//! their claim is gone.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PostParams};
use serde_json::json;

use crate::Ctx;

const LABEL: &str = "larch.dev/fake-kubelet-provisioned";

pub async fn run(ctx: Arc<Ctx>) {
    loop {
        if let Err(e) = pass(&ctx).await {
            tracing::warn!(error = %e, "volume provisioner pass");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn pass(ctx: &Ctx) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::all(ctx.client.clone());
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let all = claims.list(&ListParams::default()).await?;
    for pvc in &all.items {
        if pvc.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let phase = pvc
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        if phase == "Bound" {
            continue;
        }
        if let Err(e) = bind(ctx, &pvs, pvc).await {
            tracing::warn!(pvc = ?pvc.metadata.name, error = %e, "binding a claim");
        }
    }
    // garbage: our PVs whose claim no longer exists
    let ours = pvs
        .list(&ListParams::default().labels(&format!("{LABEL}=true")))
        .await?;
    for pv in ours.items {
        let Some(cref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            continue;
        };
        let alive = all.items.iter().any(|c| c.metadata.uid == cref.uid);
        if !alive && pv.metadata.deletion_timestamp.is_none() {
            let name = pv.metadata.name.clone().unwrap_or_default();
            tracing::info!(pv = %name, "claim gone, deleting its volume");
            let _ = pvs.delete(&name, &DeleteParams::default()).await;
            let _ = tokio::fs::remove_dir_all(ctx.data_dir.join("pv").join(&name)).await;
        }
    }
    Ok(())
}

async fn bind(
    ctx: &Ctx,
    pvs: &Api<PersistentVolume>,
    pvc: &PersistentVolumeClaim,
) -> anyhow::Result<()> {
    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let spec = pvc.spec.clone().unwrap_or_default();
    let pv_name = spec
        .volume_name
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("pvc-{uid}"));
    let dir = ctx.data_dir.join("pv").join(&pv_name);
    tokio::fs::create_dir_all(&dir).await?;
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let modes = spec
        .access_modes
        .clone()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| vec!["ReadWriteOnce".into()]);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {
            "name": pv_name,
            "labels": {LABEL: "true"},
            "annotations": {"pv.kubernetes.io/provisioned-by": "larch-fake-kubelet"},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": modes,
            "hostPath": {"path": dir.to_string_lossy(), "type": "DirectoryOrCreate"},
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": spec.storage_class_name.clone().unwrap_or_default(),
            "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": uid},
        },
    }))?;
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => {
            tracing::info!(pv = %pv_name, claim = %format!("{ns}/{name}"), dir = %dir.display(), "provisioned")
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let _ = pvs
        .patch_status(
            &pv_name,
            &ctx.patch_params(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    claims
        .patch(
            &name,
            &ctx.patch_params(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes"}},
                "spec": {"volumeName": pv_name},
            })),
        )
        .await?;
    claims
        .patch_status(
            &name,
            &ctx.patch_params(),
            &Patch::Merge(json!({"status": {"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}}})),
        )
        .await?;
    tracing::info!(claim = %format!("{ns}/{name}"), pv = %pv_name, "bound");
    Ok(())
}
