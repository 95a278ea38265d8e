//! What an ArchiveSource builds: the engine config, StatefulSet, Service, NetworkPolicy, PDB.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::builders::engine_config::resolve;
use crate::builders::tests::*;
use crate::builders::*;
use crate::crd::ArchiveSource;
use crate::crd::archive_source::EngineAccess;
use crate::source::build::{self as source, SourceChildren};

fn source_docs(c: &SourceChildren) -> String {
    docs(&[serde_json::to_value(&c.config_map).unwrap()])
        + &docs(&[&c.stateful_set])
        + &docs(&[&c.service])
        + &docs(&c.network_policy.iter().collect::<Vec<_>>())
        + &docs(&c.pod_disruption_budget.iter().collect::<Vec<_>>())
}

#[test]
fn source_children_match_golden() {
    for (name, export) in SOURCES {
        golden(name, &source_docs(&source_children(name, export)));
    }
}

/// `spec.access`: the token Secret mounted as a file and named by flag, the TLS Secret's
/// certificate served on 8443 (container and Service port `https`), probes still on `http`.
#[test]
fn engine_access_mounts_the_token_and_the_certificate() {
    let c = source_children("source-access-networkpolicy", None);
    let pod = c.stateful_set.spec.template.spec.unwrap();
    let engine = &pod.containers[0];
    let args = engine.args.clone().unwrap();
    let after = |flag: &str| {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag}: {args:?}"));
        args[i + 1].clone()
    };
    assert_eq!(after("--token-file"), "/etc/larch/api-token/token");
    assert!(args.contains(&"--allow-control".to_string()));
    assert!(args.contains(&"--protect-reads".to_string()));
    assert_eq!(after("--tls-listen"), "$(POD_IP):8443");
    assert_eq!(after("--tls-cert"), "/etc/larch/api-tls/tls.crt");
    assert_eq!(after("--tls-key"), "/etc/larch/api-tls/tls.key");
    let volumes = pod.volumes.unwrap();
    let secret = |v: &str| {
        volumes
            .iter()
            .find(|x| x.name == v)
            .unwrap()
            .secret
            .clone()
            .unwrap()
    };
    assert_eq!(
        secret("api-token").secret_name.as_deref(),
        Some("users-api-token")
    );
    assert_eq!(
        secret("api-tls").secret_name.as_deref(),
        Some("users-api-tls")
    );
    // The token is a file, never an environment value or an argument.
    assert!(
        engine
            .env
            .iter()
            .flatten()
            .all(|e| !e.name.contains("TOKEN"))
    );
    let probe = engine
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .clone()
        .unwrap();
    assert_eq!(probe.path.as_deref(), Some("/health/ready"));
    assert_eq!(probe.port, IntOrString::String("http".into()));
    let ports: Vec<_> = c
        .service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port))
        .collect();
    assert_eq!(
        ports,
        [("http".to_string(), 8080), ("https".to_string(), 8443)]
    );
    // Without spec.access: the generated token (the Secret the source owns) protects reads;
    // no control, plain HTTP only.
    let plain = source_children("source-exportref-memory", Some("export-oneshot-s3"));
    let pod = plain.stateful_set.spec.template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    let has = |f: &str| args.iter().any(|a| a == f);
    assert!(has("--token-file") && has("--protect-reads"), "{args:?}");
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--tls") || a == "--allow-control"),
        "{args:?}"
    );
    let token = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "api-token");
    assert_eq!(
        token.and_then(|v| v.secret).and_then(|s| s.secret_name),
        Some("users-cache-engine-token".to_string())
    );
    // generateToken: false (or an operator that generates none): no token, reads open.
    let (mut s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    s.spec.access = Some(EngineAccess {
        generate_token: Some(false),
        ..Default::default()
    });
    let off = |s: &ArchiveSource, ctx: &BuildContext| {
        source::children(s, &r, ctx)
            .stateful_set
            .spec
            .template
            .spec
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap()
    };
    let quiet = |args: Vec<String>| {
        !args
            .iter()
            .any(|a| a.starts_with("--token") || a == "--protect-reads")
    };
    assert!(quiet(off(&s, &ctx())));
    s.spec.access = None;
    let no_generation = BuildContext {
        generate_engine_tokens: false,
        ..ctx()
    };
    assert!(quiet(off(&s, &no_generation)));
}

/// The NetworkPolicy selects exactly the engine pods, admits the operator's namespace to the
/// probe port only and the listed clients to every API port; it follows the operator default
/// unless the ArchiveSource says.
#[test]
fn network_policy_admits_the_operator_probe_and_the_listed_clients() {
    let c = source_children("source-access-networkpolicy", None);
    let np = c.network_policy.expect("spec.networkPolicy.enabled");
    let spec = np.spec.unwrap();
    let sts_labels = c.stateful_set.spec.selector.match_labels.clone();
    assert_eq!(spec.pod_selector.unwrap().match_labels, sts_labels);
    assert_eq!(spec.policy_types.unwrap(), ["Ingress"]);
    let ingress = spec.ingress.unwrap();
    assert_eq!(ingress.len(), 2);
    let ns = ingress[0].from.as_ref().unwrap()[0]
        .namespace_selector
        .clone()
        .unwrap();
    assert_eq!(
        ns.match_labels.unwrap()["kubernetes.io/metadata.name"],
        "larch-system"
    );
    let ports =
        |r: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| -> Vec<IntOrString> {
            r.ports
                .iter()
                .flatten()
                .filter_map(|p| p.port.clone())
                .collect()
        };
    assert_eq!(ports(&ingress[0]), [IntOrString::Int(8080)]);
    assert_eq!(
        ports(&ingress[1]),
        [IntOrString::Int(8080), IntOrString::Int(8443)]
    );
    assert_eq!(ingress[1].from.as_ref().unwrap().len(), 2);

    // Off by default; the operator's --network-policies turns it on for sources that do not say.
    let (s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    assert!(source::children(&s, &r, &ctx()).network_policy.is_none());
    let on = BuildContext {
        network_policies: true,
        ..ctx()
    };
    let np = source::children(&s, &r, &on)
        .network_policy
        .expect("operator default");
    assert_eq!(
        np.spec.unwrap().ingress.unwrap().len(),
        1,
        "no clients listed: the probe only"
    );
    let (mut off, r) = resolved("source-access-networkpolicy", None);
    off.spec.network_policy.as_mut().unwrap().enabled = Some(false);
    assert!(source::children(&off, &r, &on).network_policy.is_none());
}

/// Two or more running replicas get a PodDisruptionBudget of one; one replica or a suspended
/// source none.
#[test]
fn pod_disruption_budget_only_with_two_or_more_replicas() {
    let c = source_children("source-access-networkpolicy", None);
    let pdb = c.pod_disruption_budget.expect("3 replicas").spec.unwrap();
    assert_eq!(pdb.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(
        pdb.selector.unwrap().match_labels,
        c.stateful_set.spec.selector.match_labels
    );
    let one = source_children("source-exportref-memory", Some("export-oneshot-s3"));
    assert!(one.pod_disruption_budget.is_none());
    let (mut s, r) = resolved("source-access-networkpolicy", None);
    s.spec.suspend = Some(true);
    assert!(
        source::children(&s, &r, &ctx())
            .pod_disruption_budget
            .is_none()
    );
}

#[test]
fn engine_config_from_export_ref() {
    let (s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    // The key prefix reported by the export's last run wins over the default.
    assert_eq!(r.key_prefix, "team-a/public.users/");
    let yaml = engine_config::engine_yaml(&engine_config::engine_config(&s, &r));
    let v: Value = serde_saphyr::from_str(&yaml).unwrap();
    let src = &v["sources"]["users-cache"];
    assert_eq!(src["type"], "archive");
    assert_eq!(src["store"]["type"], "s3");
    assert_eq!(src["store"]["bucket"], "seeds");
    assert_eq!(src["store"]["path_style"], true);
    assert_eq!(src["format"], serde_json::json!(["jsonl"]));
    assert_eq!(src["key_fields"], serde_json::json!(["id", "tenant"]));
    assert_eq!(src["state_path"], "/var/lib/larch/state/users-cache.pos");
    assert_eq!(src["group"], false);
    assert_eq!(v["tables"][0]["schema"], "public");
    assert_eq!(v["tables"][0]["targets"][0]["type"], "memory");
    assert_eq!(
        v["tables"][0]["targets"][0]["index_fields"],
        serde_json::json!(["tenant"])
    );
    // A missing export is a clear error.
    assert!(resolve(&s, None).unwrap_err().contains("not found"));
}

#[test]
fn engine_config_group_and_postgres_target() {
    let (s, r) = resolved("source-s3-postgres", None);
    assert!(r.group);
    let v: Value = serde_saphyr::from_str(&engine_config::engine_yaml(
        &engine_config::engine_config(&s, &r),
    ))
    .unwrap();
    let src = &v["sources"]["warehouse"];
    assert_eq!(src["state_path"], "/var/lib/larch/state/warehouse");
    // A group has no key_prefix: its prefix moves into the store.
    assert!(src.get("key_prefix").is_none());
    assert_eq!(src["store"]["prefix"], "nightly/");
    assert_eq!(src["format"], serde_json::json!(["protobuf", "jsonl"]));
    assert_eq!(v["tables"].as_array().unwrap().len(), 2);
    let t = &v["tables"][1]["targets"][0];
    assert_eq!(t["type"], "postgres");
    assert_eq!(t["connection_file"], "/etc/larch/target/dsn");
    assert_eq!(t["schema"], "replica");
    assert!(t.get("split").is_none(), "one stream unless asked");
    let (mut s, r) = resolved("source-s3-postgres", None);
    s.spec.target.postgres.as_mut().unwrap().split = Some(4);
    let v: Value = serde_saphyr::from_str(&engine_config::engine_yaml(
        &engine_config::engine_config(&s, &r),
    ))
    .unwrap();
    assert_eq!(v["tables"][1]["targets"][0]["split"], 4);
    // Volume archives of an export: the export's created claim, mounted read-only.
    let c = source_children("source-exportref-volume", Some("export-scheduled-tables"));
    let pod = c.stateful_set.spec.template.spec.unwrap();
    let vol = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "archive")
        .unwrap();
    let pvc = vol.persistent_volume_claim.unwrap();
    assert_eq!(
        (pvc.claim_name.as_str(), pvc.read_only),
        ("nightly-archive", Some(true))
    );
    let cfg = c.config_map.data.unwrap()["engine.yaml"].clone();
    assert!(
        cfg.contains("path: /var/lib/larch/archive/nightly\n"),
        "{cfg}"
    );
}

#[test]
fn config_changes_roll_the_engine_pods() {
    let (mut s, r) = resolved("source-exportref-memory", Some("export-oneshot-s3"));
    let hash = |s: &ArchiveSource| {
        source::children(s, &r, &ctx())
            .stateful_set
            .spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap()[ANNOTATION_CONFIG_HASH]
            .clone()
    };
    let before = hash(&s);
    s.spec.poll_interval = Some("1m".into());
    assert_ne!(hash(&s), before);
}

/// Engines with two or more replicas spread over nodes unless the spec says how (or `[]`).
#[test]
fn engine_replicas_spread_over_nodes_unless_told_otherwise() {
    let spread = |name: &str, edit: &dyn Fn(&mut ArchiveSource)| {
        let mut s = source_fixture(name);
        edit(&mut s);
        let r = resolve(&s, None).unwrap();
        source::children(&s, &r, &ctx())
            .stateful_set
            .spec
            .template
            .spec
            .unwrap()
            .topology_spread_constraints
    };
    let name = "source-s3-postgres";
    let default = spread(name, &|_| {}).expect("replicas: 2 spreads by default");
    assert_eq!(default.len(), 1);
    let c = &default[0];
    assert_eq!(
        (
            c.max_skew,
            c.topology_key.as_str(),
            c.when_unsatisfiable.as_str()
        ),
        (1, "kubernetes.io/hostname", "ScheduleAnyway")
    );
    let sel = c
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .clone()
        .unwrap();
    assert_eq!(sel, source::selector_labels(&source_fixture(name)));

    assert_eq!(spread(name, &|s| s.spec.replicas = Some(1)), None);
    let zones = serde_json::json!({"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "x"}}});
    let own = spread(name, &|s| {
        s.spec
            .pod
            .get_or_insert_with(Default::default)
            .topology_spread_constraints = Some(vec![zones.clone()])
    })
    .unwrap();
    assert_eq!(
        serde_json::to_value(&own).unwrap(),
        serde_json::json!([zones])
    );
    let off = spread(name, &|s| {
        s.spec
            .pod
            .get_or_insert_with(Default::default)
            .topology_spread_constraints = Some(vec![])
    });
    assert_eq!(off, Some(vec![]));
}

#[test]
fn require_transformed_reaches_the_engine_config_the_engine_reads() {
    let (mut s, r) = resolved("source-s3-postgres", None);
    let yaml = |s: &ArchiveSource| engine_config::engine_yaml(&engine_config::engine_config(s, &r));
    assert!(!yaml(&s).contains("require_transformed"));
    s.spec.require_transformed = Some(true);
    let text = yaml(&s);
    let v: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(v["sources"]["warehouse"]["require_transformed"], true);
    // The type the engine parses takes it (its validation: tests/it/operator_contract.rs).
    let file: larch_contract::engine_file::EngineFile = serde_saphyr::from_str(&text).unwrap();
    assert!(file.sources.values().all(|s| s.require_transformed));
}

#[test]
fn require_leak_check_reaches_the_engine_config_the_engine_reads() {
    let (mut s, r) = resolved("source-s3-postgres", None);
    let yaml = |s: &ArchiveSource| engine_config::engine_yaml(&engine_config::engine_config(s, &r));
    assert!(!yaml(&s).contains("require_leak_check"));
    s.spec.require_transformed = Some(true);
    s.spec.require_leak_check = Some(true);
    let text = yaml(&s);
    let file: larch_contract::engine_file::EngineFile = serde_saphyr::from_str(&text).unwrap();
    assert!(file.sources.values().all(|s| s.require_leak_check));
}
