//! The operator's rights on Leases, per namespace. A continuous export's Leases and the Role
//! granting its exporter `get`/`update` on them are managed by the operator, which must hold
//! those rights itself in that namespace (RBAC escalation prevention). Installed by the chart,
//! the operator holds no Lease rights cluster-wide (so none in kube-system): it may only `bind`
//! one ClusterRole (`--export-lease-role`), and binds it to its own ServiceAccount in the
//! namespaces where continuous exports run, owned by the export that needed it first (the
//! garbage collector removes it with that export; the next one binds it again).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};

use crate::builders::{LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY};
use crate::crd::archive_export::ArchiveExport;
use crate::reconcile::context::{Context, Error, MANAGER_EXPORT};

/// The RoleBinding's name in each namespace.
pub const BINDING: &str = "larch-operator-leases";

pub use crate::reconcile::context::LeaseRights;

/// The binding of `rights` in `ns`, owned by `export`.
pub fn binding(rights: &LeaseRights, ns: &str, export: &ArchiveExport) -> RoleBinding {
    let mut owner = crate::builders::owner_ref(export);
    // Not the binding's controller, and no finalizer write on the export to delete it.
    owner.controller = None;
    owner.block_owner_deletion = None;
    RoleBinding {
        metadata: ObjectMeta {
            name: Some(BINDING.into()),
            namespace: Some(ns.into()),
            labels: Some(
                [
                    (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
                    (LABEL_COMPONENT.to_string(), "operator".to_string()),
                ]
                .into(),
            ),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: rights.cluster_role.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: rights.service_account.clone(),
            namespace: Some(rights.namespace.clone()),
            ..Default::default()
        }]),
    }
}

/// Makes sure the operator may manage Leases in `ns` before it touches them (nothing to do
/// without `--export-lease-role`: the operator's own role grants them). A new binding is
/// waited for (the authorizer sees it within moments), so the first Lease is not refused.
pub async fn ensure(ctx: &Context, ns: &str, export: &ArchiveExport) -> Result<(), Error> {
    let Some(rights) = &ctx.lease_rights else {
        return Ok(());
    };
    let api: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), ns);
    let wanted = binding(rights, ns, export);
    match api.get_opt(BINDING).await.map_err(Error::Apply)? {
        Some(b) if b.role_ref == wanted.role_ref && b.subjects == wanted.subjects => return Ok(()),
        Some(_) => {
            api.delete(BINDING, &Default::default())
                .await
                .map_err(Error::Apply)?;
        }
        None => {}
    }
    let params = PostParams {
        field_manager: Some(MANAGER_EXPORT.into()),
        ..Default::default()
    };
    match api.create(&params, &wanted).await {
        Ok(_) => {
            tracing::info!(namespace = ns, role = %rights.cluster_role, "bound the operator's Lease rights")
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(Error::Apply(e)),
    }
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    for _ in 0..25 {
        match leases.list_metadata(&ListParams::default().limit(1)).await {
            Err(kube::Error::Api(e)) if e.code == 403 => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            _ => break,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_names_the_cluster_role_and_the_operator_only() {
        let export = crate::builders::tests::export_fixture("export-continuous-s3");
        let rights = LeaseRights {
            cluster_role: "larch-export-leases".into(),
            service_account: "larch".into(),
            namespace: "larch-system".into(),
        };
        let b = binding(&rights, "team-a", &export);
        assert_eq!(b.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            (b.role_ref.kind.as_str(), b.role_ref.name.as_str()),
            ("ClusterRole", "larch-export-leases")
        );
        let s = &b.subjects.unwrap()[0];
        assert_eq!(
            (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()),
            ("ServiceAccount", "larch", Some("larch-system"))
        );
        let owner = &b.metadata.owner_references.unwrap()[0];
        assert_eq!(owner.name, export.metadata.name.clone().unwrap());
        assert_eq!(owner.controller, None);
    }
}
