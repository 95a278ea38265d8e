//! The Node: registration, Ready heartbeats and the node Lease in `kube-node-lease`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::Ctx;

pub const CAPACITY_CPU: &str = "64";
pub const CAPACITY_MEMORY_BYTES: u64 = 256 * 1024 * 1024 * 1024;
pub const LEASE_SECONDS: i32 = 40;
pub const KUBELET_VERSION: &str = "v1.37.2-larch-fake";

fn status_patch(port: u16, now: Timestamp, transition: Timestamp) -> serde_json::Value {
    let cond = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": Time(now), "lastTransitionTime": Time(transition),
        })
    };
    json!({
        "status": {
            "capacity": {"cpu": CAPACITY_CPU, "memory": format!("{}", CAPACITY_MEMORY_BYTES), "pods": "1000", "ephemeral-storage": "1Ti"},
            "allocatable": {"cpu": CAPACITY_CPU, "memory": format!("{}", CAPACITY_MEMORY_BYTES), "pods": "1000", "ephemeral-storage": "1Ti"},
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "larch-fake-kubelet is posting ready status"),
            ],
            // no Hostname address: the apiserver would dial the node name for `kubectl logs`
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "nodeInfo": {
                "machineID": "larch-fake", "systemUUID": "larch-fake", "bootID": "larch-fake",
                "kernelVersion": "fake", "osImage": "larch fake kubelet (local processes)",
                "containerRuntimeVersion": "fake://0.1.0", "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
            },
        }
    })
}

/// Creates (or adopts) the Node and marks it Ready.
pub async fn register(ctx: &Ctx) -> anyhow::Result<Node> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let name = &ctx.node;
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch,
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": arch,
                "node.kubernetes.io/instance-type": "larch-fake",
                "larch.dev/fake-kubelet": "true",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = %name, "registered node"),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            // adopt: our labels, no taints left over from a previous not-ready period
            nodes
                .patch(
                    name,
                    &ctx.patch_params(),
                    &Patch::Merge(json!({"metadata": {"labels": node.metadata.labels}, "spec": {"taints": null, "unschedulable": null}})),
                )
                .await
                .context("adopting the existing node")?;
            tracing::info!(node = %name, "node exists, adopted it");
        }
        Err(e) => return Err(e).context("creating the node"),
    }
    let now = Timestamp::now();
    let n = nodes
        .patch_status(
            name,
            &ctx.patch_params(),
            &Patch::Merge(status_patch(
                ctx.kubelet_port.load(Ordering::Relaxed),
                now,
                now,
            )),
        )
        .await
        .context("setting the node status")?;
    Ok(n)
}

/// Renews the Lease every 10 s and the Ready heartbeat every 20 s, until the process exits.
pub async fn heartbeat(ctx: std::sync::Arc<Ctx>, node_uid: String) {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let ready_since = Timestamp::now();
    let mut tick = 0u64;
    loop {
        let now = Timestamp::now();
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {
                "name": ctx.node, "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": ctx.node, "uid": node_uid}],
            },
            "spec": {"holderIdentity": ctx.node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": MicroTime(now)},
        }))
        .expect("lease");
        let r = leases
            .patch(
                &ctx.node,
                &ctx.patch_params(),
                &Patch::Merge(json!({"spec": lease.spec})),
            )
            .await;
        match r {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {
                if let Err(e) = leases.create(&PostParams::default(), &lease).await {
                    tracing::warn!(error = %e, "creating the node lease");
                }
            }
            Err(e) => tracing::warn!(error = %e, "renewing the node lease"),
        }
        if tick.is_multiple_of(2)
            && let Err(e) = nodes
                .patch_status(
                    &ctx.node,
                    &ctx.patch_params(),
                    &Patch::Merge(status_patch(
                        ctx.kubelet_port.load(Ordering::Relaxed),
                        now,
                        ready_since,
                    )),
                )
                .await
        {
            tracing::warn!(error = %e, "node status heartbeat");
        }
        tick += 1;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// Patch parameters with the fake kubelet's field manager.
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some("larch-fake-kubelet".into()),
        ..Default::default()
    }
}
