//! Preparing a pod's volumes as host directories under `--data-dir/<ns>/<pod>/<uid>/volumes/`:
//! configMap, secret, emptyDir, projected (serviceAccountToken, configMap, secret, downwardAPI),
//! downwardAPI, persistentVolumeClaim (the bound PV's hostPath) and hostPath. The pod's
//! processes see them through bind mounts in their own mount namespace (see `process`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod,
    Secret, ServiceAccount,
};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::Ctx;
use crate::env::PodFacts;

pub const SA_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Name of the volume this kubelet adds when the ServiceAccount admission plugin did not.
pub const DEFAULT_SA_VOLUME: &str = "larch-fake-kube-api-access";

/// File ownership for what is prepared: the pod's user and fsGroup (or group).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Owner {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl Owner {
    fn apply(&self, path: &Path) -> std::io::Result<()> {
        if self.uid.is_none() && self.gid.is_none() {
            return Ok(());
        }
        std::os::unix::fs::chown(path, self.uid, self.gid)
    }
}

/// A projected service-account token to refresh while the pod runs.
#[derive(Clone, Debug)]
pub struct TokenFile {
    pub dir: PathBuf,
    pub rel: String,
    pub service_account: String,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
    pub mode: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Prepared {
    /// volume name -> host path
    pub volumes: BTreeMap<String, PathBuf>,
    pub read_only: BTreeMap<String, bool>,
    pub tokens: Vec<TokenFile>,
}

/// A relative path without `..` or absolute components.
fn safe_rel(rel: &str) -> anyhow::Result<PathBuf> {
    let p = PathBuf::from(rel);
    if rel.is_empty() || p.components().any(|c| !matches!(c, Component::Normal(_))) {
        bail!("invalid relative path {rel:?}");
    }
    Ok(p)
}

/// Writes `dir/rel` atomically with `mode`.
pub fn write_file(
    dir: &Path,
    rel: &str,
    data: &[u8],
    mode: u32,
    owner: Owner,
) -> anyhow::Result<()> {
    let path = dir.join(safe_rel(rel)?);
    let parent = path.parent().expect("has parent");
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(
        ".{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, data)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    owner.apply(&tmp)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

fn fresh_dir(dir: &Path, mode: u32, owner: Owner) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    owner.apply(dir)?;
    Ok(())
}

/// Writes keys of `data` (all, or `items`) into `dir`. Missing keys in `items` are errors
/// unless `optional`.
pub fn project_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    owner: Owner,
) -> anyhow::Result<()> {
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                match data.get(&it.key) {
                    Some(v) => {
                        let mode = it.mode.map_or(default_mode, |m| m as u32);
                        write_file(dir, &it.path, v, mode, owner)?;
                    }
                    None if optional => {}
                    None => bail!("references non-existent key: {}", it.key),
                }
            }
        }
        _ => {
            for (k, v) in data {
                write_file(dir, k, v, default_mode, owner)?;
            }
        }
    }
    Ok(())
}

async fn config_map_data(
    ctx: &Ctx,
    ns: &str,
    name: &str,
) -> anyhow::Result<Option<BTreeMap<String, Vec<u8>>>> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let Some(cm) = api.get_opt(name).await? else {
        // KCM publishes kube-root-ca.crt in every namespace; fall back to the kubeconfig's CA
        if name == "kube-root-ca.crt" {
            return Ok(Some(
                [("ca.crt".to_string(), ctx.ca_pem.clone().into_bytes())].into(),
            ));
        }
        return Ok(None);
    };
    let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in cm.data.unwrap_or_default() {
        out.insert(k, v.into_bytes());
    }
    for (k, v) in cm.binary_data.unwrap_or_default() {
        out.insert(k, v.0);
    }
    Ok(Some(out))
}

async fn secret_data(
    ctx: &Ctx,
    ns: &str,
    name: &str,
) -> anyhow::Result<Option<BTreeMap<String, Vec<u8>>>> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    Ok(api.get_opt(name).await?.map(|s| {
        s.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()
    }))
}

/// Requests a token for `sa` bound to the pod (TokenRequest API).
pub async fn request_token(
    ctx: &Ctx,
    facts: &PodFacts,
    sa: &str,
    audience: Option<&str>,
    expiration_seconds: i64,
) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &facts.namespace);
    let mut spec = json!({
        "expirationSeconds": expiration_seconds.max(600),
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": facts.name, "uid": facts.uid},
    });
    if let Some(a) = audience.filter(|a| !a.is_empty()) {
        spec["audiences"] = json!([a]);
    }
    let body =
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
    let tr: TokenRequest = api
        .create_subresource("token", sa, &PostParams::default(), &body)
        .await
        .with_context(|| format!("TokenRequest for serviceaccount {}/{sa}", facts.namespace))?;
    tr.status
        .and_then(|s| s.token)
        .context("TokenRequest without a token")
}

fn downward_files(
    dir: &Path,
    items: &[DownwardAPIVolumeFile],
    facts: &PodFacts,
    default_mode: u32,
    owner: Owner,
) -> anyhow::Result<()> {
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            facts.field(&f.field_path).map_err(|e| anyhow!(e))?
        } else if let Some(r) = &it.resource_field_ref {
            match r.resource.as_str() {
                "limits.cpu" | "requests.cpu" => crate::node::CAPACITY_CPU.to_string(),
                _ => crate::node::CAPACITY_MEMORY_BYTES.to_string(),
            }
        } else {
            String::new()
        };
        let mode = it.mode.map_or(default_mode, |m| m as u32);
        write_file(dir, &it.path, value.as_bytes(), mode, owner)?;
    }
    Ok(())
}

/// Whether the kubelet must add the service-account volume itself: automount is not disabled
/// (pod, then ServiceAccount) and the admission plugin did not add a mount at the standard path.
pub async fn needs_default_sa(ctx: &Ctx, pod: &Pod, facts: &PodFacts) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let mounted = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path.trim_end_matches('/') == SA_MOUNT_PATH)
        });
    if mounted {
        return false;
    }
    if let Some(a) = spec.automount_service_account_token {
        return a;
    }
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &facts.namespace);
    match api.get_opt(&facts.service_account).await {
        Ok(Some(sa)) => sa.automount_service_account_token != Some(false),
        _ => true,
    }
}

/// Prepares every volume of the pod under `root`.
pub async fn prepare(
    ctx: &Ctx,
    pod: &Pod,
    facts: &PodFacts,
    root: &Path,
    owner: Owner,
) -> anyhow::Result<Prepared> {
    let mut out = Prepared::default();
    let ns = facts.namespace.as_str();
    let vroot = root.join("volumes");
    std::fs::create_dir_all(&vroot)?;
    let spec = pod.spec.clone().unwrap_or_default();
    for v in spec.volumes.iter().flatten() {
        let dir = vroot.join(&v.name);
        let ctxmsg = || format!("volume {:?}", v.name);
        if v.empty_dir.is_some() {
            if !dir.exists() {
                fresh_dir(&dir, 0o777, owner)?;
            }
        } else if let Some(cm) = &v.config_map {
            fresh_dir(&dir, 0o755, Owner::default())?;
            let mode = cm.default_mode.map_or(0o644, |m| m as u32);
            let optional = cm.optional.unwrap_or(false);
            match config_map_data(ctx, ns, &cm.name).await? {
                Some(data) => project_keys(&dir, &data, cm.items.as_deref(), mode, optional, owner)
                    .with_context(|| format!("configmap {:?}", cm.name))?,
                None if optional => {}
                None => bail!("configmap {:?} not found", cm.name),
            }
        } else if let Some(s) = &v.secret {
            fresh_dir(&dir, 0o755, Owner::default())?;
            let name = s.secret_name.clone().unwrap_or_default();
            let mode = s.default_mode.map_or(0o644, |m| m as u32);
            let optional = s.optional.unwrap_or(false);
            match secret_data(ctx, ns, &name).await? {
                Some(data) => project_keys(&dir, &data, s.items.as_deref(), mode, optional, owner)
                    .with_context(|| format!("secret {name:?}"))?,
                None if optional => {}
                None => bail!("secret {name:?} not found"),
            }
        } else if let Some(d) = &v.downward_api {
            fresh_dir(&dir, 0o755, Owner::default())?;
            let mode = d.default_mode.map_or(0o644, |m| m as u32);
            downward_files(&dir, d.items.as_deref().unwrap_or(&[]), facts, mode, owner)?;
        } else if let Some(p) = &v.projected {
            fresh_dir(&dir, 0o755, Owner::default())?;
            let mode = p.default_mode.map_or(0o644, |m| m as u32);
            for src in p.sources.iter().flatten() {
                if let Some(t) = &src.service_account_token {
                    let exp = t.expiration_seconds.unwrap_or(3600);
                    let token = request_token(
                        ctx,
                        facts,
                        &facts.service_account,
                        t.audience.as_deref(),
                        exp,
                    )
                    .await?;
                    let tf = TokenFile {
                        dir: dir.clone(),
                        rel: t.path.clone(),
                        service_account: facts.service_account.clone(),
                        audience: t.audience.clone(),
                        expiration_seconds: exp,
                        mode,
                    };
                    write_file(&dir, &tf.rel, token.as_bytes(), mode, owner)?;
                    out.tokens.push(tf);
                }
                if let Some(cm) = &src.config_map {
                    let optional = cm.optional.unwrap_or(false);
                    match config_map_data(ctx, ns, &cm.name).await? {
                        Some(data) => {
                            project_keys(&dir, &data, cm.items.as_deref(), mode, optional, owner)?
                        }
                        None if optional => {}
                        None => bail!("configmap {:?} not found", cm.name),
                    }
                }
                if let Some(s) = &src.secret {
                    let optional = s.optional.unwrap_or(false);
                    match secret_data(ctx, ns, &s.name).await? {
                        Some(data) => {
                            project_keys(&dir, &data, s.items.as_deref(), mode, optional, owner)?
                        }
                        None if optional => {}
                        None => bail!("secret {:?} not found", s.name),
                    }
                }
                if let Some(d) = &src.downward_api {
                    downward_files(&dir, d.items.as_deref().unwrap_or(&[]), facts, mode, owner)?;
                }
            }
        } else if let Some(c) = &v.persistent_volume_claim {
            let path = claim_path(ctx, ns, &c.claim_name)
                .await
                .with_context(ctxmsg)?;
            owner.apply(&path)?;
            out.read_only
                .insert(v.name.clone(), c.read_only.unwrap_or(false));
            out.volumes.insert(v.name.clone(), path);
            continue;
        } else if let Some(h) = &v.host_path {
            let path = PathBuf::from(&h.path);
            match h.type_.as_deref() {
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&path)?,
                Some("FileOrCreate") if !path.exists() => std::fs::write(&path, b"")?,
                _ => {}
            }
            out.volumes.insert(v.name.clone(), path);
            continue;
        } else {
            tracing::warn!(pod = %facts.name, volume = %v.name, "unsupported volume type, using an empty directory");
            if !dir.exists() {
                fresh_dir(&dir, 0o777, owner)?;
            }
        }
        out.volumes.insert(v.name.clone(), dir);
    }
    if needs_default_sa(ctx, pod, facts).await {
        let dir = vroot.join(DEFAULT_SA_VOLUME);
        fresh_dir(&dir, 0o755, Owner::default())?;
        let token = request_token(ctx, facts, &facts.service_account, None, 3607).await?;
        write_file(&dir, "token", token.as_bytes(), 0o644, owner)?;
        write_file(&dir, "ca.crt", ctx.ca_pem.as_bytes(), 0o644, owner)?;
        write_file(&dir, "namespace", facts.namespace.as_bytes(), 0o644, owner)?;
        out.tokens.push(TokenFile {
            dir: dir.clone(),
            rel: "token".into(),
            service_account: facts.service_account.clone(),
            audience: None,
            expiration_seconds: 3607,
            mode: 0o644,
        });
        out.read_only.insert(DEFAULT_SA_VOLUME.into(), true);
        out.volumes.insert(DEFAULT_SA_VOLUME.into(), dir);
    }
    Ok(out)
}

/// The host directory of a bound claim (its PV's hostPath or local path).
async fn claim_path(ctx: &Ctx, ns: &str, claim: &str) -> anyhow::Result<PathBuf> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let pvc = claims
        .get_opt(claim)
        .await?
        .ok_or_else(|| anyhow!("persistentvolumeclaim {claim:?} not found"))?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let Some(pv_name) = pvc.spec.and_then(|s| s.volume_name).filter(|_| bound) else {
        bail!("waiting for persistentvolumeclaim {claim:?} to be bound");
    };
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let pv = pvs
        .get(&pv_name)
        .await
        .with_context(|| format!("persistentvolume {pv_name}"))?;
    let spec = pv.spec.unwrap_or_default();
    let path = spec
        .host_path
        .map(|h| h.path)
        .or(spec.local.map(|l| l.path))
        .ok_or_else(|| anyhow!("persistentvolume {pv_name} is neither hostPath nor local"))?;
    let path = PathBuf::from(path);
    std::fs::create_dir_all(&path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_items_and_modes() {
        let dir = std::env::temp_dir().join(format!("larch-fk-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let data: BTreeMap<String, Vec<u8>> = [
            ("a".to_string(), b"A".to_vec()),
            ("b".to_string(), b"B".to_vec()),
        ]
        .into();
        project_keys(
            &dir.join("all"),
            &data,
            None,
            0o600,
            false,
            Owner::default(),
        )
        .unwrap();
        assert_eq!(std::fs::read(dir.join("all/a")).unwrap(), b"A");
        let mode = std::fs::metadata(dir.join("all/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let items = vec![KeyToPath {
            key: "b".into(),
            path: "sub/dir/bee".into(),
            mode: Some(0o640),
            user: None,
        }];
        project_keys(
            &dir.join("items"),
            &data,
            Some(&items),
            0o644,
            false,
            Owner::default(),
        )
        .unwrap();
        assert_eq!(std::fs::read(dir.join("items/sub/dir/bee")).unwrap(), b"B");
        assert!(!dir.join("items/a").exists());
        let missing = vec![KeyToPath {
            key: "zz".into(),
            path: "zz".into(),
            mode: None,
            user: None,
        }];
        assert!(
            project_keys(
                &dir.join("m"),
                &data,
                Some(&missing),
                0o644,
                false,
                Owner::default()
            )
            .is_err()
        );
        assert!(
            project_keys(
                &dir.join("m"),
                &data,
                Some(&missing),
                0o644,
                true,
                Owner::default()
            )
            .is_ok()
        );
        let evil = vec![KeyToPath {
            key: "a".into(),
            path: "../../etc/x".into(),
            mode: None,
            user: None,
        }];
        assert!(
            project_keys(
                &dir.join("e"),
                &data,
                Some(&evil),
                0o644,
                false,
                Owner::default()
            )
            .is_err()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
