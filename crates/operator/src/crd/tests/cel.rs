//! The CRDs' CEL validation rules and duration fields: what the API server accepts and refuses.

use super::*;

fn export(spec: Value) -> Value {
    json!({"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveExport",
           "metadata": {"name": "orders", "namespace": "ns"}, "spec": spec})
}

fn export_spec() -> Value {
    json!({
        "source": {"connectionSecretRef": {"name": "pg", "key": "dsn"}, "table": {"name": "orders"}},
        "destination": {"s3": {"bucket": "seeds", "credentials": {"secretRef": {"name": "s3"}}}},
        "mode": "OneShot"
    })
}

fn assert_rejects(errors: Vec<String>, needle: &str) {
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "expected an error containing {needle:?}, got {errors:?}"
    );
}

#[test]
fn cel_accepts_a_valid_export_and_its_typed_form() {
    let crd = ArchiveExport::crd();
    let obj = export(export_spec());
    assert_eq!(cel(&crd, &obj, None), Vec::<String>::new());
    // The typed object round-trips and validates the same way.
    let typed: ArchiveExport = serde_json::from_value(obj.clone()).unwrap();
    assert!(kube::core::cel::validate_cel(&typed).is_ok());
    assert!(kube::core::cel::validate_cel_update(&typed, &typed).is_ok());
}

#[test]
fn cel_export_one_of_rules() {
    let crd = ArchiveExport::crd();
    let s = export_spec();
    let both_dest = with(s.clone(), "/destination/volume", json!({"claimName": "x"}));
    assert_rejects(
        cel(&crd, &export(both_dest), None),
        "exactly one of s3 or volume",
    );
    let no_dest = with(s.clone(), "/destination", json!({}));
    assert_rejects(
        cel(&crd, &export(no_dest), None),
        "exactly one of s3 or volume",
    );
    let both_tables = with(s.clone(), "/source/tables", json!([{"name": "a"}]));
    assert_rejects(
        cel(&crd, &export(both_tables), None),
        "exactly one of table or tables",
    );
    let vol_both = with(
        s.clone(),
        "/destination",
        json!({"volume": {"claimName": "a", "size": "1Gi"}}),
    );
    assert_rejects(
        cel(&crd, &export(vol_both), None),
        "exactly one of claimName",
    );
    let class_without_size = with(
        s.clone(),
        "/destination",
        json!({"volume": {"claimName": "a", "storageClassName": "fast"}}),
    );
    assert_rejects(
        cel(&crd, &export(class_without_size), None),
        "apply only with size",
    );
    let ca_both = with(
        s.clone(),
        "/destination/s3/caBundle",
        json!({"configMap": {"name": "a", "key": "k"}, "secret": {"name": "a", "key": "k"}}),
    );
    assert_rejects(
        cel(&crd, &export(ca_both), None),
        "exactly one of configMap or secret",
    );
    let ok_vol = with(
        s,
        "/destination",
        json!({"volume": {"size": "5Gi", "storageClassName": "fast"}}),
    );
    assert_eq!(cel(&crd, &export(ok_vol), None), Vec::<String>::new());
}

#[test]
fn cel_parallel_needs_a_oneshot_export_of_tables() {
    let crd = ArchiveExport::crd();
    let tables = with(
        without(export_spec(), "/source/table"),
        "/source/tables",
        json!([{"name": "a"}, {"name": "b"}]),
    );
    let ok = with(tables.clone(), "/parallel", json!(2));
    assert_eq!(cel(&crd, &export(ok), None), Vec::<String>::new());
    let single = with(export_spec(), "/parallel", json!(2));
    assert_rejects(
        cel(&crd, &export(single), None),
        "parallel applies to mode OneShot with source.tables",
    );
    let continuous = with(
        with(tables, "/parallel", json!(2)),
        "/mode",
        json!("Continuous"),
    );
    assert_rejects(
        cel(&crd, &export(continuous), None),
        "parallel applies to mode OneShot with source.tables",
    );
}

/// `split`: one table's OneShot export (a schedule too), not with parallel or subset;
/// `workers` at most `ranges`, on an S3 destination, without a schedule; both bounded.
#[test]
fn cel_split_needs_a_oneshot_export_of_one_table() {
    let crd = ArchiveExport::crd();
    let split = |v: Value| with(export_spec(), "/split", v);
    let ok = split(json!({"ranges": 4, "workers": 2}));
    assert_eq!(cel(&crd, &export(ok.clone()), None), Vec::<String>::new());
    let in_pod = split(json!({"ranges": 4}));
    assert_eq!(
        cel(&crd, &export(in_pod.clone()), None),
        Vec::<String>::new()
    );
    let scheduled = with(in_pod.clone(), "/schedule", json!({"cron": "@daily"}));
    assert_eq!(cel(&crd, &export(scheduled), None), Vec::<String>::new());
    let one_table = "split applies to mode OneShot (a schedule too) of exactly one table";
    let continuous = with(in_pod.clone(), "/mode", json!("Continuous"));
    assert_rejects(cel(&crd, &export(continuous), None), one_table);
    let tables = with(
        without(in_pod.clone(), "/source/table"),
        "/source/tables",
        json!([{"name": "a"}]),
    );
    assert_rejects(cel(&crd, &export(tables.clone()), None), one_table);
    let parallel = with(tables, "/parallel", json!(2));
    assert_rejects(
        cel(&crd, &export(parallel), None),
        "without parallel or subset",
    );
    let subset = with(
        in_pod.clone(),
        "/subset",
        json!({"roots": {"public.orders": {}}}),
    );
    assert_rejects(
        cel(&crd, &export(subset), None),
        "without parallel or subset",
    );
    let too_many = split(json!({"ranges": 2, "workers": 3}));
    assert_rejects(
        cel(&crd, &export(too_many), None),
        "split.workers must not exceed split.ranges",
    );
    let volume = |v: Value| with(v, "/destination", json!({"volume": {"claimName": "a"}}));
    assert_rejects(
        cel(&crd, &export(volume(ok.clone())), None),
        "split.workers (ranges copied by worker pods) needs an S3 destination",
    );
    assert_eq!(
        cel(&crd, &export(volume(in_pod)), None),
        Vec::<String>::new()
    );
    let scheduled_workers = with(ok, "/schedule", json!({"cron": "@daily"}));
    assert_rejects(
        cel(&crd, &export(scheduled_workers), None),
        "split.workers does not apply with a schedule",
    );
    // The bounds the API server checks before the rules.
    let schema = schema_of(&crd);
    let fields = &schema["properties"]["spec"]["properties"]["split"];
    let bounds = |f: &str| {
        let p = &fields["properties"][f];
        (p["minimum"].as_f64(), p["maximum"].as_f64())
    };
    assert_eq!(bounds("ranges"), (Some(2.0), Some(64.0)));
    assert_eq!(bounds("workers"), (Some(1.0), Some(64.0)));
    assert_eq!(fields["required"], json!(["ranges"]));
}

#[test]
fn cel_export_mode_rules_and_sane_values() {
    let crd = ArchiveExport::crd();
    let s = export_spec();
    let cont_sched = with(
        with(s.clone(), "/mode", json!("Continuous")),
        "/schedule",
        json!({"cron": "0 2 * * *"}),
    );
    assert_rejects(
        cel(&crd, &export(cont_sched), None),
        "schedule applies only to mode OneShot",
    );
    let oneshot_policy = with(s.clone(), "/continuous", json!({"diffInterval": "30s"}));
    assert_rejects(
        cel(&crd, &export(oneshot_policy), None),
        "continuous applies only to mode Continuous",
    );
    let subset =
        json!({"tables": {"public.orders": {"where": "id > 1", "sample": {"percent": 10}}}});
    let oneshot_subset = with(s.clone(), "/transform", subset.clone());
    assert_eq!(
        cel(&crd, &export(oneshot_subset), None),
        Vec::<String>::new()
    );
    for t in [
        json!({"tables": {"public.orders": {"where": "id > 1"}}}),
        json!({"tables": {"public.orders": {"sample": {"percent": 10}}}}),
    ] {
        let continuous_subset = with(
            with(s.clone(), "/mode", json!("Continuous")),
            "/transform",
            t,
        );
        assert_rejects(
            cel(&crd, &export(continuous_subset), None),
            "where and sample (subsetting) apply only to mode OneShot",
        );
    }
    let continuous_masked = with(
        with(s.clone(), "/mode", json!("Continuous")),
        "/transform",
        json!({"tables": {"public.orders": {"columns": {"id": "hash"}}}}),
    );
    assert_eq!(
        cel(&crd, &export(continuous_masked), None),
        Vec::<String>::new()
    );
    let bad_cron = with(s.clone(), "/schedule", json!({"cron": "0 0 2 * * *"}));
    assert_rejects(
        cel(&crd, &export(bad_cron), None),
        "cron must have 5 fields",
    );
    let tz_cron = with(
        s.clone(),
        "/schedule",
        json!({"cron": "CRON_TZ=UTC 0 2 * * *"}),
    );
    assert_rejects(cel(&crd, &export(tz_cron), None), "timeZone");
    for good in ["0 2 * * *", "*/15 * * * 1-5", "@daily"] {
        let ok = with(
            s.clone(),
            "/schedule",
            json!({"cron": good, "timeZone": "Europe/Berlin"}),
        );
        assert_eq!(cel(&crd, &export(ok), None), Vec::<String>::new(), "{good}");
    }
    let cont = with(s.clone(), "/mode", json!("Continuous"));
    let inverted = with(
        cont.clone(),
        "/continuous",
        json!({"minInterval": "10m", "maxInterval": "90s"}),
    );
    assert_rejects(
        cel(&crd, &export(inverted), None),
        "minInterval must not exceed maxInterval",
    );
    let ordered = with(
        cont,
        "/continuous",
        json!({"minInterval": "500ms", "maxInterval": "1h"}),
    );
    assert_eq!(cel(&crd, &export(ordered), None), Vec::<String>::new());
    let bad_prefix = with(s.clone(), "/keyPrefix", json!("nightly"));
    assert_rejects(
        cel(&crd, &export(bad_prefix), None),
        "keyPrefix must end with '/'",
    );
    let bad_endpoint = with(s.clone(), "/destination/s3/endpoint", json!("minio:9000"));
    assert_rejects(
        cel(&crd, &export(bad_endpoint), None),
        "http:// or https://",
    );
    let slot_with_tables = with(
        with(
            without(s.clone(), "/source/table"),
            "/source/tables",
            json!([{"name": "a"}, {"name": "b"}]),
        ),
        "/source/slotName",
        json!("s"),
    );
    assert_rejects(
        cel(&crd, &export(slot_with_tables), None),
        "slotName and publicationName apply to a single table",
    );
    let dup_tables = with(
        without(s.clone(), "/source/table"),
        "/source/tables",
        json!([{"name": "a"}, {"name": "a"}]),
    );
    assert_rejects(
        cel(&crd, &export(dup_tables), None),
        "tables must be distinct",
    );
    let mut long = export(s);
    long["metadata"]["name"] = json!("x".repeat(41));
    assert_rejects(cel(&crd, &long, None), "at most 40 characters");
}

#[test]
fn cel_session_limits_name_the_bad_field() {
    let crd = ArchiveExport::crd();
    let limits = |v: Value| export(with(export_spec(), "/source/sessionLimits", v));
    let good = json!({"statementTimeout": "2m", "lockTimeout": "500ms",
                      "idleInTransactionTimeout": "1m30s", "snapshotMaxAge": "2d"});
    assert_eq!(cel(&crd, &limits(good), None), Vec::<String>::new());
    for field in [
        "statementTimeout",
        "lockTimeout",
        "idleInTransactionTimeout",
        "snapshotMaxAge",
    ] {
        assert_rejects(
            cel(&crd, &limits(json!({ field: "0s" })), None),
            &format!("{field} must be"),
        );
    }
}

#[test]
fn cel_export_immutable_fields() {
    let crd = ArchiveExport::crd();
    let old = export(export_spec());
    let new_bucket = export(with(
        export_spec(),
        "/destination/s3/bucket",
        json!("other"),
    ));
    assert_rejects(cel(&crd, &new_bucket, Some(&old)), "bucket is immutable");
    let new_table = export(with(export_spec(), "/source/table/name", json!("other")));
    assert_rejects(cel(&crd, &new_table, Some(&old)), "table(s) are immutable");
    let to_volume = export(with(
        export_spec(),
        "/destination",
        json!({"volume": {"claimName": "a"}}),
    ));
    assert_rejects(cel(&crd, &to_volume, Some(&old)), "kind of location");
    // Mutable things stay mutable: credentials, prefix, mode.
    let changed = export(with(
        with(
            export_spec(),
            "/destination/s3/credentials/secretRef/name",
            json!("rotated"),
        ),
        "/mode",
        json!("Continuous"),
    ));
    assert_eq!(cel(&crd, &changed, Some(&old)), Vec::<String>::new());
}

fn source(spec: Value) -> Value {
    json!({"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSource",
           "metadata": {"name": "orders", "namespace": "ns"}, "spec": spec})
}

fn source_spec() -> Value {
    json!({"archive": {"exportRef": {"name": "orders"}}, "target": {"memory": {"indexFields": ["tenant"]}}})
}

#[test]
fn cel_source_rules() {
    let crd = ArchiveSource::crd();
    let s = source_spec();
    assert_eq!(cel(&crd, &source(s.clone()), None), Vec::<String>::new());
    let both = with(s.clone(), "/archive/s3", json!({"bucket": "seeds"}));
    assert_rejects(
        cel(&crd, &source(both), None),
        "exactly one of exportRef or a location",
    );
    let none = with(s.clone(), "/archive", json!({}));
    assert_rejects(
        cel(&crd, &source(none), None),
        "exactly one of exportRef or a location",
    );
    let explicit_without_table = with(s.clone(), "/archive", json!({"s3": {"bucket": "seeds"}}));
    assert_rejects(
        cel(&crd, &source(explicit_without_table), None),
        "set table or tables",
    );
    let explicit = with(
        with(
            s.clone(),
            "/archive",
            json!({"s3": {"bucket": "seeds"}, "formats": ["jsonl"]}),
        ),
        "/table",
        json!({"name": "t"}),
    );
    assert_eq!(cel(&crd, &source(explicit), None), Vec::<String>::new());
    let prefix_with_ref = with(s.clone(), "/archive/keyPrefix", json!("x/"));
    assert_rejects(
        cel(&crd, &source(prefix_with_ref), None),
        "come from the ArchiveExport",
    );
    let sized_volume = with(
        with(s.clone(), "/archive", json!({"volume": {"size": "1Gi"}})),
        "/table",
        json!({"name": "t"}),
    );
    assert_rejects(cel(&crd, &source(sized_volume), None), "existing claim");
    let two_targets = with(
        s.clone(),
        "/target/postgres",
        json!({"connectionSecretRef": {"name": "a", "key": "b"}}),
    );
    assert_rejects(
        cel(&crd, &source(two_targets), None),
        "exactly one of memory or postgres",
    );
    // control and protectReads need a token: named, or generated (generateToken not false).
    for access in [
        json!({"control": true}),
        json!({"protectReads": true, "generateToken": true}),
        json!({"control": true, "generateToken": false, "tokenSecretRef": {"name": "t", "key": "k"}}),
        json!({"generateToken": false}),
    ] {
        let ok = with(s.clone(), "/access", access.clone());
        assert_eq!(
            cel(&crd, &source(ok), None),
            Vec::<String>::new(),
            "{access}"
        );
    }
    for access in [
        json!({"control": true, "generateToken": false}),
        json!({"protectReads": true, "generateToken": false}),
    ] {
        let bad = with(s.clone(), "/access", access);
        assert_rejects(cel(&crd, &source(bad), None), "need a token");
    }
    // state is immutable, in every direction.
    let with_state = source(with(s.clone(), "/state", json!({"size": "1Gi"})));
    let old = source(s.clone());
    assert_rejects(cel(&crd, &with_state, Some(&old)), "state is immutable");
    assert_rejects(cel(&crd, &old, Some(&with_state)), "state is immutable");
    let bigger = source(with(s, "/state", json!({"size": "2Gi"})));
    assert_rejects(cel(&crd, &bigger, Some(&with_state)), "state is immutable");
    assert_eq!(
        cel(&crd, &with_state, Some(&with_state)),
        Vec::<String>::new()
    );
}

// ---- ArchiveSourceSet ----

fn source_set(spec: Value) -> Value {
    json!({"apiVersion": "larch.dev/v1alpha1", "kind": "ArchiveSourceSet",
           "metadata": {"name": "dev-seed"}, "spec": spec})
}

fn source_set_spec() -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {"larch.dev/seed": "events"}},
        "template": {"spec": {
            "archive": {"s3": {"bucket": "seeds", "credentials": {"secretRef": {"name": "s3"}}}},
            "table": {"name": "events"},
            "target": {"memory": {}}
        }},
        "credentials": {"secretRef": {"namespace": "platform", "name": "seed-reader"}, "shareToNamespaces": true}
    })
}

/// What the archive layer refuses is refused at admission too: key prefixes leaving the
/// store's root, table and schema names with `/` or `..`, key fields the exporter cannot take
/// as a list. A name PostgreSQL allows is not refused (it is looked up and reported).
#[test]
fn cel_refuses_key_prefixes_names_and_key_fields_that_cannot_work() {
    let crd = ArchiveExport::crd();
    let s = export_spec();
    for bad in ["../../etc/", "/abs/", "a/./b/", "a/../", "./", "a\\b/"] {
        let obj = export(with(s.clone(), "/keyPrefix", json!(bad)));
        assert_rejects(cel(&crd, &obj, None), "keyPrefix must not start with '/'");
        // The same rule the CLI applies.
        assert!(
            larch_archive::store::check_key_prefix(bad).is_err(),
            "{bad}"
        );
    }
    for good in ["", "nightly/", "team-a/2026.11/", "a..b/", ".hidden/"] {
        let obj = export(with(s.clone(), "/keyPrefix", json!(good)));
        assert_eq!(cel(&crd, &obj, None), Vec::<String>::new(), "{good:?}");
        assert!(
            larch_archive::store::check_key_prefix(good).is_ok(),
            "{good}"
        );
    }
    for bad in ["a/b", "..", "x..y"] {
        let obj = export(with(s.clone(), "/source/table", json!({"name": bad})));
        assert_rejects(
            cel(&crd, &obj, None),
            "table name must not contain '/' or '..'",
        );
        let obj = export(with(
            s.clone(),
            "/source/table",
            json!({"schema": bad, "name": "t"}),
        ));
        assert_rejects(cel(&crd, &obj, None), "schema must not contain '/' or '..'");
    }
    let quoted = export(with(
        s.clone(),
        "/source/table",
        json!({"name": "events; DROP TABLE events"}),
    ));
    assert_eq!(cel(&crd, &quoted, None), Vec::<String>::new());
    for bad in ["a,b", " id", "id "] {
        let obj = export(with(s.clone(), "/source/keyFields", json!(["x", bad])));
        assert_rejects(cel(&crd, &obj, None), "key fields must not contain ','");
    }
    let obj = export(with(s, "/source/keyFields", json!(["id", "tenant_id"])));
    assert_eq!(cel(&crd, &obj, None), Vec::<String>::new());

    let crd = ArchiveSource::crd();
    let explicit = json!({
        "archive": {"s3": {"bucket": "seeds"}, "keyPrefix": "../x/"},
        "table": {"name": "events"},
        "target": {"memory": {}}
    });
    assert_rejects(
        cel(&crd, &source(explicit.clone()), None),
        "keyPrefix must not start with '/'",
    );
    let bad_table = with(
        with(explicit, "/archive/keyPrefix", json!("seed/")),
        "/tables",
        json!([{"name": "ok"}, {"name": "a/b"}]),
    );
    assert_rejects(
        cel(&crd, &source(without(bad_table, "/table")), None),
        "table name must not contain",
    );
}

#[test]
fn cel_source_set_rules() {
    let crd = ArchiveSourceSet::crd();
    let ok = source_set(source_set_spec());
    assert_eq!(cel(&crd, &ok, None), Vec::<String>::new());
    let typed: ArchiveSourceSet = serde_json::from_value(ok.clone()).unwrap();
    assert!(kube::core::cel::validate_cel(&typed).is_ok());

    // Sharing is an explicit opt-in.
    let no_opt_in = with(
        ok.clone(),
        "/spec/credentials/shareToNamespaces",
        json!(false),
    );
    assert_rejects(cel(&crd, &no_opt_in, None), "shareToNamespaces: true");
    // Without credentials, the template names a per-namespace Secret (or none at all).
    assert_eq!(
        cel(&crd, &without(ok.clone(), "/spec/credentials"), None),
        Vec::<String>::new()
    );
    // An empty selector would select every namespace.
    let empty = with(ok.clone(), "/spec/namespaceSelector", json!({}));
    assert_rejects(cel(&crd, &empty, None), "must not be empty");
    let empty_labels = with(
        ok.clone(),
        "/spec/namespaceSelector",
        json!({"matchLabels": {}}),
    );
    assert_rejects(cel(&crd, &empty_labels, None), "must not be empty");
    let expr = with(
        ok.clone(),
        "/spec/namespaceSelector",
        json!({"matchExpressions": [{"key": "team", "operator": "Exists"}]}),
    );
    assert_eq!(cel(&crd, &expr, None), Vec::<String>::new());
    let bad_expr = with(
        ok.clone(),
        "/spec/namespaceSelector",
        json!({"matchExpressions": [{"key": "team", "operator": "In"}]}),
    );
    assert_rejects(cel(&crd, &bad_expr, None), "In and NotIn need values");
    // Credentials only make sense for an S3 archive.
    let volume = with(
        ok.clone(),
        "/spec/template/spec/archive",
        json!({"volume": {"claimName": "seed"}}),
    );
    assert_rejects(
        cel(&crd, &volume, None),
        "credentials apply to an s3 archive",
    );
    // The template is checked by the ArchiveSource's own rules.
    let two_targets = with(
        ok.clone(),
        "/spec/template/spec/target",
        json!({"memory": {}, "postgres": {"connectionSecretRef": {"name": "a", "key": "b"}}}),
    );
    assert_rejects(
        cel(&crd, &two_targets, None),
        "set exactly one of memory or postgres",
    );
    let long = with(ok, "/metadata/name", json!("x".repeat(41)));
    assert_rejects(cel(&crd, &long, None), "at most 40 characters");
}

/// Every duration field refuses exactly what `larch_core::duration` refuses, as far as the offline
/// evaluator can tell (the OpenAPI pattern and maxLength checked here with the `regex` crate, the
/// CEL rule by kube's evaluator). That evaluator (the `cel` crate) is not the API server's
/// cel-go: its `duration()` has no `µs`/`μs` and no range check, so it differs on exactly the
/// texts below. The API server is the authority: e2e s20 runs the same table against it and
/// finds no difference.
const OFFLINE_CEL_DIFFERS: &[&str] = &[
    "2\u{b5}s",
    "2\u{3bc}s",
    "2562047h47m16.854775808s",
    "2562048h",
    "9223372036854775808ns",
    "99999999999999999999h",
];

#[test]
fn duration_fields_refuse_what_the_parser_refuses() {
    use larch_core::duration::{AGREEMENT_CASES, parse_age, parse_positive};
    let export_crd = ArchiveExport::crd();
    let source_crd = ArchiveSource::crd();
    let cont = with(export_spec(), "/mode", json!("Continuous"));
    type Parser = fn(&str) -> Result<std::time::Duration, String>;
    let limits = with(export_spec(), "/source/sessionLimits", json!({}));
    let fields: [(&CustomResourceDefinition, Value, &str, &str, Parser); 9] = [
        (
            &export_crd,
            export(limits.clone()),
            "/spec/source/sessionLimits",
            "statementTimeout",
            parse_positive,
        ),
        (
            &export_crd,
            export(limits.clone()),
            "/spec/source/sessionLimits",
            "lockTimeout",
            parse_positive,
        ),
        (
            &export_crd,
            export(limits.clone()),
            "/spec/source/sessionLimits",
            "idleInTransactionTimeout",
            parse_positive,
        ),
        (
            &export_crd,
            export(limits.clone()),
            "/spec/source/sessionLimits",
            "snapshotMaxAge",
            parse_age,
        ),
        (
            &export_crd,
            export(cont.clone()),
            "/spec/continuous",
            "diffInterval",
            parse_positive,
        ),
        (
            &export_crd,
            export(cont.clone()),
            "/spec/continuous",
            "minInterval",
            parse_positive,
        ),
        (
            &export_crd,
            export(cont.clone()),
            "/spec/continuous",
            "maxInterval",
            parse_positive,
        ),
        (
            &export_crd,
            export(export_spec()),
            "/spec/retention",
            "maxAge",
            parse_age,
        ),
        (
            &source_crd,
            source(source_spec()),
            "/spec",
            "pollInterval",
            parse_positive,
        ),
    ];
    let mut disagreements = Vec::new();
    for (crd, base, parent, field, parser) in fields {
        let schema = schema_of(crd);
        let mut field_schema = &schema;
        for seg in parent.split('/').skip(1) {
            field_schema = &field_schema["properties"][seg];
        }
        let field_schema = &field_schema["properties"][field];
        let pattern = regex::Regex::new(field_schema["pattern"].as_str().unwrap()).unwrap();
        let max_len = field_schema["maxLength"].as_u64().unwrap() as usize;
        for &text in AGREEMENT_CASES {
            let mut obj = base.clone();
            if obj.pointer(parent).is_none() {
                let (p, k) = parent.rsplit_once('/').unwrap();
                obj.pointer_mut(p).unwrap()[k] = json!({});
            }
            obj.pointer_mut(parent).unwrap()[field] = json!(text);
            let schema_ok = text.len() <= max_len && pattern.is_match(text);
            let crd_ok = schema_ok && cel(crd, &obj, None).is_empty();
            let parser_ok = parser(text).is_ok();
            if crd_ok != parser_ok && !OFFLINE_CEL_DIFFERS.contains(&text) {
                disagreements.push(format!(
                    "{field}={text:?}: crd {crd_ok} (schema {schema_ok}, cel {:?}), parser {:?}",
                    cel(crd, &obj, None),
                    parser(text)
                ));
            }
            if crd_ok == parser_ok && OFFLINE_CEL_DIFFERS.contains(&text) {
                disagreements.push(format!(
                    "{field}={text:?}: the offline evaluator now agrees: shorten OFFLINE_CEL_DIFFERS"
                ));
            }
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}
