//! Container environment: `env` (value with `$(VAR)` expansion, valueFrom secretKeyRef /
//! configMapKeyRef / fieldRef / resourceFieldRef) and `envFrom` (Secret / ConfigMap), resolved the
//! way the kubelet's `makeEnvironmentVariables` does it: base variables first (service links of the
//! `kubernetes` service here), then `envFrom` in order, then `env` in order; later definitions win.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::expand::expand_with;

/// What `fieldRef` can see of a pod.
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub node_name: String,
    pub service_account: String,
    pub pod_ip: String,
    pub host_ip: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl PodFacts {
    pub fn from_pod(pod: &Pod, pod_ip: &str, host_ip: &str) -> Self {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        Self {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            node_name: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
            pod_ip: pod_ip.to_string(),
            host_ip: host_ip.to_string(),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
        }
    }

    /// Value of a downward-API `fieldPath`.
    pub fn field(&self, path: &str) -> Result<String, String> {
        let quoted = |prefix: &str| {
            path.strip_prefix(prefix)
                .and_then(|r| r.strip_suffix("']"))
                .map(str::to_string)
        };
        Ok(match path {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.namespace.clone(),
            "metadata.uid" => self.uid.clone(),
            "spec.nodeName" => self.node_name.clone(),
            "spec.serviceAccountName" => self.service_account.clone(),
            "status.podIP" | "status.podIPs" => self.pod_ip.clone(),
            "status.hostIP" | "status.hostIPs" => self.host_ip.clone(),
            "metadata.labels" => format_map(&self.labels),
            "metadata.annotations" => format_map(&self.annotations),
            _ => {
                if let Some(k) = quoted("metadata.labels['") {
                    self.labels.get(&k).cloned().unwrap_or_default()
                } else if let Some(k) = quoted("metadata.annotations['") {
                    self.annotations.get(&k).cloned().unwrap_or_default()
                } else {
                    return Err(format!("unsupported fieldPath {path:?}"));
                }
            }
        })
    }
}

/// The downward-API file format of a label/annotation map: `key="value"` lines, sorted.
fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v:?}\n"))
        .collect::<String>()
}

/// ConfigMaps and Secrets of the pod's namespace, fetched beforehand (absent = not found).
#[derive(Clone, Debug, Default)]
pub struct Refs {
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    pub secrets: BTreeMap<String, BTreeMap<String, String>>,
}

/// Names of the ConfigMaps and Secrets referenced by the env of any container of the pod.
pub fn referenced(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut cms = BTreeSet::new();
    let mut secrets = BTreeSet::new();
    let Some(spec) = &pod.spec else {
        return (cms, secrets);
    };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.config_map_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &e.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
        for e in c.env.iter().flatten() {
            if let Some(vf) = &e.value_from {
                if let Some(r) = &vf.config_map_key_ref {
                    cms.insert(r.name.clone());
                }
                if let Some(r) = &vf.secret_key_ref {
                    secrets.insert(r.name.clone());
                }
            }
        }
    }
    (cms, secrets)
}

/// A C identifier-ish env name as the kubelet accepts from envFrom (it skips invalid keys).
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

fn set(out: &mut Vec<(String, String)>, name: String, value: String) {
    if let Some(slot) = out.iter_mut().find(|(k, _)| *k == name) {
        slot.1 = value;
    } else {
        out.push((name, value));
    }
}

/// Resolves the environment of `c`. `base` comes first (and is visible to `$(VAR)` expansion).
/// An error is a `CreateContainerConfigError` message (missing non-optional ConfigMap/Secret/key).
pub fn resolve_env(
    c: &Container,
    facts: &PodFacts,
    refs: &Refs,
    base: &[(String, String)],
) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in base {
        set(&mut out, k.clone(), v.clone());
    }
    let ns = &facts.namespace;
    for e in c.env_from.iter().flatten() {
        let prefix = e.prefix.clone().unwrap_or_default();
        let (data, optional, what, name) = if let Some(r) = &e.config_map_ref {
            (
                refs.config_maps.get(&r.name),
                r.optional.unwrap_or(false),
                "configmap",
                &r.name,
            )
        } else if let Some(r) = &e.secret_ref {
            (
                refs.secrets.get(&r.name),
                r.optional.unwrap_or(false),
                "secret",
                &r.name,
            )
        } else {
            continue;
        };
        match data {
            Some(data) => {
                for (k, v) in data {
                    let key = format!("{prefix}{k}");
                    if valid_env_name(&key) {
                        set(&mut out, key, v.clone());
                    }
                }
            }
            None if optional => {}
            None => return Err(format!("{what} \"{name}\" not found in namespace {ns}")),
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(vf) = &e.value_from {
            if let Some(r) = &vf.config_map_key_ref {
                match refs.config_maps.get(&r.name).map(|d| d.get(&r.key)) {
                    Some(Some(v)) => v.clone(),
                    _ if r.optional.unwrap_or(false) => continue,
                    Some(None) => {
                        return Err(format!(
                            "couldn't find key {} in ConfigMap {ns}/{}",
                            r.key, r.name
                        ));
                    }
                    None => return Err(format!("configmap \"{}\" not found", r.name)),
                }
            } else if let Some(r) = &vf.secret_key_ref {
                match refs.secrets.get(&r.name).map(|d| d.get(&r.key)) {
                    Some(Some(v)) => v.clone(),
                    _ if r.optional.unwrap_or(false) => continue,
                    Some(None) => {
                        return Err(format!(
                            "couldn't find key {} in Secret {ns}/{}",
                            r.key, r.name
                        ));
                    }
                    None => return Err(format!("secret \"{}\" not found", r.name)),
                }
            } else if let Some(r) = &vf.field_ref {
                facts.field(&r.field_path)?
            } else if let Some(r) = &vf.resource_field_ref {
                resource_field(c, &r.resource)
            } else {
                return Err(format!("env {}: unsupported valueFrom", e.name));
            }
        } else {
            match &e.value {
                Some(v) if !v.is_empty() => expand_with(v, &out),
                _ => String::new(),
            }
        };
        set(&mut out, e.name.clone(), value);
    }
    Ok(out)
}

/// `resourceFieldRef`: the container's limit/request as written (divisors are not applied);
/// unset limits report the node's generous capacity, as the kubelet reports allocatable.
fn resource_field(c: &Container, resource: &str) -> String {
    let res = c.resources.as_ref();
    let (map, key) = match resource.split_once('.') {
        Some(("limits", k)) => (res.and_then(|r| r.limits.as_ref()), k),
        Some(("requests", k)) => (res.and_then(|r| r.requests.as_ref()), k),
        _ => return String::new(),
    };
    match map.and_then(|m| m.get(key)) {
        Some(q) => q.0.clone(),
        None if key == "cpu" => crate::node::CAPACITY_CPU.to_string(),
        None if key == "memory" => crate::node::CAPACITY_MEMORY_BYTES.to_string(),
        None => "0".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p-1", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
            "spec": {"nodeName": "larch-node", "serviceAccountName": "sa", "containers": containers}
        }))
        .unwrap()
    }

    fn refs() -> Refs {
        let mut r = Refs::default();
        r.config_maps.insert(
            "cm".into(),
            [
                ("A".to_string(), "from-cm".to_string()),
                ("B".to_string(), "b".to_string()),
                ("1bad".to_string(), "x".to_string()),
            ]
            .into(),
        );
        r.secrets.insert(
            "sec".into(),
            [("PASSWORD".to_string(), "s3cr3t".to_string())].into(),
        );
        r
    }

    fn resolve(p: &Pod) -> Result<Vec<(String, String)>, String> {
        let facts = PodFacts::from_pod(p, "127.1.0.7", "127.0.0.1");
        let base = vec![(
            "KUBERNETES_SERVICE_HOST".to_string(),
            "127.0.0.1".to_string(),
        )];
        resolve_env(
            &p.spec.as_ref().unwrap().containers[0],
            &facts,
            &refs(),
            &base,
        )
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn values_field_refs_and_expansion() {
        let p = pod(json!([{"name": "c", "image": "larch", "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "LISTEN", "value": "$(POD_IP):8080"},
            {"name": "LATER", "value": "$(DEFINED_LATER)"},
            {"name": "DEFINED_LATER", "value": "x"},
            {"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST)"},
            {"name": "EMPTY"}
        ]}]));
        let env = resolve(&p).unwrap();
        assert_eq!(get(&env, "POD_IP"), Some("127.1.0.7"));
        assert_eq!(get(&env, "POD_NAME"), Some("p-1"));
        assert_eq!(get(&env, "POD_NS"), Some("ns"));
        assert_eq!(get(&env, "SA"), Some("sa"));
        assert_eq!(get(&env, "APP"), Some("x"));
        assert_eq!(get(&env, "LISTEN"), Some("127.1.0.7:8080"));
        assert_eq!(get(&env, "LATER"), Some("$(DEFINED_LATER)"));
        assert_eq!(get(&env, "API"), Some("https://127.0.0.1"));
        assert_eq!(get(&env, "EMPTY"), Some(""));
        assert_eq!(env[0].0, "KUBERNETES_SERVICE_HOST");
    }

    #[test]
    fn env_from_and_key_refs() {
        let p = pod(json!([{"name": "c", "image": "larch",
        "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "sec"}, "prefix": "S_"}],
        "env": [
            {"name": "A", "value": "override"},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "PASSWORD"}}},
            {"name": "CMB", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "B"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope", "optional": true}}},
            {"name": "OPT2", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "k", "optional": true}}}
        ]}]));
        let env = resolve(&p).unwrap();
        assert_eq!(get(&env, "A"), Some("override"));
        assert_eq!(get(&env, "B"), Some("b"));
        assert_eq!(get(&env, "1bad"), None);
        assert_eq!(get(&env, "S_PASSWORD"), Some("s3cr3t"));
        assert_eq!(get(&env, "PW"), Some("s3cr3t"));
        assert_eq!(get(&env, "CMB"), Some("b"));
        assert_eq!(get(&env, "OPT"), None);
        assert_eq!(get(&env, "OPT2"), None);
    }

    #[test]
    fn missing_references_are_errors_unless_optional() {
        let p = pod(json!([{"name": "c", "image": "larch",
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "nope"}}}]}]));
        assert_eq!(
            resolve(&p).unwrap_err(),
            "couldn't find key nope in Secret ns/sec"
        );
        let p = pod(
            json!([{"name": "c", "image": "larch", "envFrom": [{"configMapRef": {"name": "gone"}}]}]),
        );
        assert!(resolve(&p).unwrap_err().contains("not found"));
        let p = pod(
            json!([{"name": "c", "image": "larch", "envFrom": [{"configMapRef": {"name": "gone", "optional": true}}]}]),
        );
        assert!(resolve(&p).is_ok());
    }

    #[test]
    fn referenced_names() {
        let p = pod(json!([{"name": "c", "image": "larch",
            "envFrom": [{"configMapRef": {"name": "cm"}}],
            "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "PASSWORD"}}}]}]));
        let (cms, secrets) = referenced(&p);
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), vec!["cm"]);
        assert_eq!(secrets.into_iter().collect::<Vec<_>>(), vec!["sec"]);
    }
}
