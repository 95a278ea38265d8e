//! What an ArchiveExport builds: its Job, CronJob or Deployment, requests, cleanup Jobs, slot names.

use larch_contract::export_request::ExportRequest;

use crate::builders::tests::*;
use crate::crd::ArchiveExport;
use crate::export::build as export;
use crate::export::children::{ExportChildren, children};

fn export_docs(c: &ExportChildren) -> String {
    let mut out = String::new();
    if let Some(p) = &c.pvc {
        out += &docs(&[p]);
    }
    out += &(docs(&c.jobs) + &docs(&c.cron_jobs) + &docs(&c.deployments));
    if let Some(la) = &c.lease_access {
        out += &(docs(&la.leases)
            + &docs(&la.service_account.iter().collect::<Vec<_>>())
            + &docs(&[&la.role])
            + &docs(&[&la.role_binding]));
    }
    out
}

#[test]
fn export_children_match_golden() {
    for name in EXPORTS {
        golden(name, &export_docs(&export_children(name)));
    }
}

/// The deletion's cleanup Job of every export fixture and the slot monitor of the suspended
/// continuous one: pinned, restricted, and the cleanup Job deliberately without an owner.
#[test]
fn cleanup_jobs_and_the_slot_monitor_match_golden() {
    use crate::export::cleanup_job::{cleanup_job, slot_monitor};
    let mut out = String::new();
    let mut pods = vec![];
    for name in EXPORTS {
        let job = cleanup_job(&export_fixture(name), &ctx());
        let v = serde_json::to_value(&job).unwrap();
        assert!(
            v["metadata"]["ownerReferences"].is_null(),
            "{name}: no owner"
        );
        assert_eq!(job.spec.as_ref().unwrap().backoff_limit, Some(0));
        pods.push((
            format!("{name} cleanup"),
            job.spec.clone().unwrap().template.spec.unwrap(),
        ));
        out += &docs(&[job]);
    }
    let mut suspended = export_fixture("export-continuous-s3");
    assert!(
        slot_monitor(&suspended, &ctx()).is_none(),
        "running: no monitor"
    );
    suspended.spec.suspend = Some(true);
    let children = children(&suspended, None, &ctx());
    let monitor = children.slot_monitor.expect("suspended: a monitor");
    assert_eq!(
        children.deployments[0].spec.replicas,
        Some(0),
        "the writer is scaled to zero"
    );
    pods.push((
        "slot monitor".into(),
        monitor.spec.template.spec.clone().unwrap(),
    ));
    out += &docs(&[monitor]);
    golden("export-lifecycle", &out);
    for (what, spec) in &pods {
        assert_restricted(what, spec);
        assert_eq!(spec.automount_service_account_token, Some(false), "{what}");
    }
    // A temporary slot is not kept: nothing to monitor.
    let mut temporary = suspended.clone();
    temporary.spec.source.slot_mode = Some(crate::crd::archive_export::SlotMode::Temporary);
    assert!(slot_monitor(&temporary, &ctx()).is_none());
    assert_eq!(
        crate::export::cleanup_job::cleanup_args(&export_fixture("export-oneshot-s3")).join(" "),
        "export cleanup --connection-file /etc/larch/source/dsn --slot larch_users --publication larch_users \
         --owner archiveexport/data/users --wait 60s --summary-file /dev/termination-log"
    );
}

/// The cleanup Job and the slot monitor open sessions on the source too: the export's
/// `sessionLimits` hold for them (the snapshot's age does not: they hold no snapshot).
#[test]
fn session_limits_reach_the_cleanup_and_the_slot_monitor() {
    use crate::export::cleanup_job::{cleanup_args, slot_monitor};
    let flags = |args: &[String]| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0].ends_with("-timeout") || w[0] == "--snapshot-max-age")
            .map(|w| w.join("="))
            .collect()
    };
    let mut e = export_fixture("export-continuous-s3");
    e.spec.source.session_limits = None;
    assert!(flags(&cleanup_args(&e)).is_empty(), "unset: the defaults");
    e.spec.source.session_limits = Some(crate::crd::archive_export::SessionLimits {
        statement_timeout: Some("2m".into()),
        lock_timeout: Some("3s".into()),
        idle_in_transaction_timeout: None,
        snapshot_max_age: Some("2d".into()),
    });
    let expected = ["--statement-timeout=2m", "--lock-timeout=3s"];
    assert_eq!(flags(&cleanup_args(&e)), expected);
    e.spec.suspend = Some(true);
    let monitor = slot_monitor(&e, &ctx()).expect("suspended: a monitor");
    let pod = monitor.spec.template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    assert_eq!(flags(&args), expected);
}

#[test]
fn retention_applies_to_every_mode() {
    let mut e = export_fixture("export-oneshot-s3");
    e.spec.retention = Some(crate::crd::archive_export::Retention {
        keep_epochs: Some(2),
        max_age: Some("7d".into()),
    });
    let t = e.spec.source.all_tables()[0].clone();
    let r = export::export_request(&e, &t);
    assert_eq!((r.keep_epochs, r.max_age.as_deref()), (2, Some("7d")));
    // The deprecated continuous.keepEpochs still works, and retention wins over it.
    let mut c = export_fixture("export-continuous-s3");
    let t = c.spec.source.all_tables()[0].clone();
    assert_eq!(export::export_request(&c, &t).keep_epochs, 3);
    c.spec.retention = Some(crate::crd::archive_export::Retention {
        keep_epochs: Some(5),
        max_age: None,
    });
    assert_eq!(export::export_request(&c, &t).keep_epochs, 5);
}

#[test]
fn session_limits_reach_the_request() {
    let limits = crate::crd::archive_export::SessionLimits {
        statement_timeout: Some("2m".into()),
        lock_timeout: Some("3s".into()),
        idle_in_transaction_timeout: Some("45s".into()),
        snapshot_max_age: Some("2d".into()),
    };
    let request = |e: &ArchiveExport| match export::exports_as_one_set(e) {
        true => export::set_export_request(e),
        false => export::export_request(e, &e.spec.source.all_tables()[0]),
    };
    for fixture in [
        "export-oneshot-s3",
        "export-continuous-s3",
        "export-oneshot-set",
    ] {
        let mut e = export_fixture(fixture);
        // Unset: the request leaves them to `larch export`'s defaults.
        e.spec.source.session_limits = None;
        let r = request(&e);
        assert_eq!((r.statement_timeout, r.snapshot_max_age), (None, None));
        e.spec.source.session_limits = Some(limits.clone());
        let r = request(&e);
        assert_eq!(
            [
                r.statement_timeout.as_deref(),
                r.lock_timeout.as_deref(),
                r.idle_in_transaction_timeout.as_deref(),
                r.snapshot_max_age.as_deref(),
            ],
            [Some("2m"), Some("3s"), Some("45s"), Some("2d")],
            "{fixture}"
        );
    }
}

#[test]
fn export_requests_follow_the_cli_contract() {
    let e = export_fixture("export-oneshot-s3");
    let t = e.spec.source.all_tables()[0].clone();
    let r = export::export_request(&e, &t);
    assert_eq!(
        export::export_args(&r),
        ["export", "--request", r.to_json().as_str()],
        "one argument: the request"
    );
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        serde_json::json!({
            "connectionFile": "/etc/larch/source/dsn",
            "schema": "public",
            "tables": ["users"],
            "store": {"type": "s3", "bucket": "seeds", "prefix": "team-a",
                      "endpoint": "https://s3.internal:8333", "region": "eu-west-1", "path_style": true},
            "formats": ["jsonl"],
            "keyFields": ["id", "tenant"],
            "summaryFile": "/dev/termination-log",
            "slot": "larch_users",
            "owner": "archiveexport/data/users",
            "publication": "larch_users",
            "listen": "$(POD_IP):8080",
        })
    );
    let c = export_fixture("export-continuous-s3");
    let t = c.spec.source.all_tables()[0].clone();
    let r = export::export_request(&c, &t);
    assert!(r.follow);
    assert_eq!(r.keep_epochs, 3);
    assert_eq!(
        (
            r.diff_interval.as_deref(),
            r.min_interval.as_deref(),
            r.max_interval.as_deref()
        ),
        (Some("15s"), Some("5s"), Some("5m"))
    );
    assert_eq!(
        (r.max_diff_bytes, r.max_diff_fraction.as_deref()),
        (Some(67108864), Some("0.25"))
    );
    assert_eq!(
        (r.max_churn_records, r.max_churn_fraction.as_deref()),
        (Some(100000), Some("0.5"))
    );
    assert_eq!(
        (r.buffer_memory, r.spill_dir.as_deref(), r.spill_limit),
        (
            Some(67108864),
            Some(std::path::Path::new("/var/lib/larch/spill")),
            Some(7730941131)
        )
    );
    assert_eq!(
        (r.listen.as_deref(), r.lease.as_deref()),
        (Some("$(POD_IP):8080"), Some("events"))
    );
    // tables: one export per table, each under <keyPrefix><schema>.<table>/
    let s = export_fixture("export-scheduled-tables");
    let per_table: Vec<ExportRequest> = s
        .spec
        .source
        .all_tables()
        .iter()
        .map(|t| export::export_request(&s, t))
        .collect();
    assert_eq!(
        (per_table[0].schema.as_deref(), &per_table[0].tables[..]),
        (Some("public"), &["orders".to_string()][..])
    );
    assert_eq!(
        per_table[0].store,
        larch_archive::store::spec::StoreSpec::local("/var/lib/larch/archive")
    );
    assert_eq!(
        per_table[0].key_prefix.as_deref(),
        Some("nightly/public.orders/")
    );
    assert_eq!(
        (per_table[1].schema.as_deref(), &per_table[1].tables[..]),
        (Some("sales"), &["invoices".to_string()][..])
    );
    assert_eq!(
        per_table[1].key_prefix.as_deref(),
        Some("nightly/sales.invoices/")
    );
}

#[test]
fn spill_settings_derive_from_the_memory_limit_and_size_the_spill_volume() {
    use crate::crd::common_pod::Resources;
    let mut c = export_fixture("export-continuous-s3");
    let settings = export::spill_settings(&c);
    assert_eq!(
        (settings.buffer_memory, settings.size.as_str()),
        (64 << 20, "8Gi"),
        "no memory limit: 64Mi"
    );
    c.spec.resources = Some(Resources {
        requests: None,
        limits: Some([("memory".to_string(), "1Gi".to_string())].into()),
    });
    assert_eq!(export::spill_settings(&c).buffer_memory, 256 << 20);
    c.spec.resources.as_mut().unwrap().limits =
        Some([("memory".to_string(), "32Mi".into())].into());
    assert_eq!(
        export::spill_settings(&c).buffer_memory,
        16 << 20,
        "at least 16Mi"
    );
    let policy = c.spec.continuous.as_mut().unwrap();
    policy.buffer_memory = Some("100Mi".into());
    policy.spill_size = Some("20Gi".into());
    let settings = export::spill_settings(&c);
    assert_eq!(settings.buffer_memory, 100 << 20, "explicit wins");
    assert_eq!(settings.limit, (20u64 << 30) / 10 * 9);
    let t = c.spec.source.all_tables()[0].clone();
    let pod = export::pod_template(&c, &t, &ctx(), None).spec.unwrap();
    let spill = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "spill")
        .unwrap();
    assert_eq!(
        spill.empty_dir.unwrap().size_limit.unwrap().0,
        "20Gi",
        "the emptyDir is sized for spilling"
    );
    let mounts = pod.containers[0].volume_mounts.clone().unwrap();
    assert!(mounts.iter().any(|m| m.name == "spill"
        && m.mount_path == export::SPILL_DIR
        && m.read_only != Some(true)));
    // OneShot exports never spill: no volume, no settings.
    let o = export_fixture("export-oneshot-s3");
    let t = o.spec.source.all_tables()[0].clone();
    let r = export::export_request(&o, &t);
    assert_eq!(
        (r.spill_dir, r.spill_limit, r.buffer_memory),
        (None, None, None)
    );
}

#[test]
fn run_id_changes_with_spec_and_token_only() {
    let e = export_fixture("export-oneshot-s3");
    let base = export::run_id(&e, None);
    assert_eq!(base.len(), 8);
    let mut labelled = e.clone();
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("x".into(), "y".into());
    assert_eq!(export::run_id(&labelled, None), base);
    assert_ne!(export::run_id(&e, Some("again")), base);
    let mut changed = e.clone();
    changed.spec.backoff_limit = Some(5);
    assert_ne!(export::run_id(&changed, None), base);
}

#[test]
fn modes_produce_the_right_kinds() {
    let one = export_children("export-oneshot-s3");
    assert_eq!(
        (one.jobs.len(), one.cron_jobs.len(), one.deployments.len()),
        (1, 0, 0)
    );
    assert!(one.pvc.is_none());
    let sched = export_children("export-scheduled-tables");
    assert_eq!(
        (
            sched.jobs.len(),
            sched.cron_jobs.len(),
            sched.deployments.len()
        ),
        (2, 2, 0)
    );
    assert!(sched.pvc.is_some());
    assert_eq!(
        sched.cron_jobs[0].spec.concurrency_policy.as_deref(),
        Some("Forbid")
    );
    assert_eq!(
        sched.cron_jobs[0].spec.time_zone.as_deref(),
        Some("Europe/Berlin")
    );
    let no_run = children(&export_fixture("export-scheduled-tables"), None, &ctx());
    assert!(no_run.jobs.is_empty(), "a schedule alone creates no Job");
    let cont = export_children("export-continuous-s3");
    assert_eq!(
        (
            cont.jobs.len(),
            cont.cron_jobs.len(),
            cont.deployments.len()
        ),
        (0, 0, 1)
    );
    let d = &cont.deployments[0].spec;
    assert_eq!(d.replicas, Some(1));
    assert_eq!(
        d.strategy.as_ref().unwrap().type_.as_deref(),
        Some("Recreate")
    );
}

#[test]
fn spec_transform_reaches_the_exporter_with_its_key_mounted_from_the_secret() {
    let mut e = export_fixture("export-oneshot-s3");
    e.spec.transform = serde_saphyr::from_str(
        "tables:\n  public.users:\n    undeclared: null\n    columns: {id: hash, email: {redact: x}}\nkeySecretRef: {name: seed-key, key: hmac}",
    )
    .unwrap();
    let t = e.spec.source.all_tables()[0].clone();
    let args = export::export_args(&export::export_request(&e, &t));
    // What the pod gets parses back into the same rules, as the exporter reads them.
    let r = request_of(&args);
    assert_eq!(
        r.transform,
        Some(e.spec.transform.as_ref().unwrap().rules())
    );
    assert!(
        !args[2].contains("seed-key"),
        "the Secret is not in the args"
    );
    assert_eq!(
        r.transform_key_file.as_deref(),
        Some(std::path::Path::new("/etc/larch/transform-key/key"))
    );
    let (mounts, volumes) = export::source_mounts(&e);
    let m = mounts.iter().find(|m| m.name == "transform-key").unwrap();
    assert_eq!(m.mount_path, "/etc/larch/transform-key");
    assert_eq!(m.read_only, Some(true));
    let v = volumes.iter().find(|v| v.name == "transform-key").unwrap();
    let secret = v.secret.as_ref().unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("seed-key"));
    assert_eq!(secret.items.as_ref().unwrap()[0].key, "hmac");
    assert!(!r.leak_check, "no leak check unless asked for");
    e.spec.transform.as_mut().unwrap().leak_check = true;
    assert!(request_of(&export::export_args(&export::export_request(&e, &t))).leak_check);
    assert!(!r.require_validated, "informational unless asked for");
    e.spec.transform.as_mut().unwrap().require_validated = true;
    let strict = request_of(&export::export_args(&export::export_request(&e, &t)));
    assert!(strict.require_validated);
    // Without a transform, nothing of it.
    let plain = export_fixture("export-oneshot-s3");
    let r = export::export_request(&plain, &t);
    assert_eq!((r.transform, r.transform_key_file), (None, None));
    assert!(!r.leak_check);
    assert!(!r.require_validated);
}

#[test]
fn a_oneshot_export_of_tables_with_parallel_is_one_job_at_one_position() {
    let e = export_fixture("export-oneshot-set");
    let run = export::run_id(&e, None);
    let c = children(&e, Some(&run), &ctx());
    assert_eq!(c.jobs.len(), 1, "one Job for the whole set");
    assert!(c.cron_jobs.is_empty() && c.deployments.is_empty());
    let job = &c.jobs[0];
    assert_eq!(
        job.metadata.name.as_deref(),
        Some(format!("ledger-{run}").as_str())
    );
    let r = export::set_export_request(&e);
    assert_eq!(
        (r.tables.join(" "), r.parallel),
        (
            "public.accounts public.transfers audit.ledger".to_string(),
            Some(3)
        )
    );
    // The prefix the exporter puts each table under, as per-table Jobs are given it.
    assert_eq!(r.key_prefix.as_deref(), Some("ledger/"));
    let slot = export::set_slot_name(&e);
    assert!(slot.starts_with("larch_data_ledger_"), "{slot}");
    assert_eq!(r.slot.as_deref(), Some(slot.as_str()));
    assert_eq!(r.schema, None);
    // Without parallel: one Job per table, as before.
    let mut per_table = e.clone();
    per_table.spec.parallel = None;
    let c = children(&per_table, Some(&run), &ctx());
    assert_eq!(c.jobs.len(), 3);
    // Scheduled: one CronJob `<name>` for the set.
    let mut scheduled = e;
    scheduled.spec.schedule = export_fixture("export-scheduled-tables").spec.schedule;
    let c = children(&scheduled, None, &ctx());
    assert_eq!(c.cron_jobs.len(), 1);
    assert_eq!(c.cron_jobs[0].metadata.name.as_deref(), Some("ledger"));
    assert!(c.jobs.is_empty());
}

/// A subset that follows foreign keys goes to the set's one Job, whole, and the operator checks
/// what it can without the database (names, the roots' `where:`), naming the field.
#[test]
fn a_subset_goes_to_the_sets_job_and_bad_subsets_name_the_field() {
    let mut e = export_fixture("export-oneshot-set");
    let spec: larch_contract::subset_spec::SubsetSpec = larch_contract::from_yaml(
        "roots: {public.transfers: {where: \"amount > 100\"}}\n\
         downward: [{table: public.transfers, references: public.accounts, limit: 10}]\n",
    )
    .unwrap();
    e.spec.subset = Some(spec.clone());
    assert_eq!(crate::export::validate::export(&e), Ok(()));
    assert_eq!(export::set_export_request(&e).subset, Some(spec));
    let bad = |yaml: &str| {
        let mut e = e.clone();
        e.spec.subset = Some(larch_contract::from_yaml(yaml).unwrap());
        crate::export::validate::export(&e).unwrap_err()
    };
    assert_eq!(
        bad("roots: {}"),
        "spec.subset: roots: no root table: name at least one"
    );
    let err = bad("roots: {public.transfers: {where: \"pg_sleep(10) IS NULL\"}}");
    assert!(
        err.starts_with("spec.subset.roots[\"public.transfers\"].where \"pg_sleep(10) IS NULL\":"),
        "{err}"
    );
}

/// Issue 35, finding 4: names that mapped alike (`team-a`/`b-users`, `team-a-b`/`users`) get
/// distinct slots; every name is a valid identifier of at most 63 bytes and never changes.
#[test]
fn derived_slot_names_are_distinct_across_namespaces_short_and_stable() {
    use crate::export::build::export_slot_name;
    let valid = |s: &str| {
        s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let a = export_slot_name("team-a", "b-users", None);
    let b = export_slot_name("team-a-b", "users", None);
    assert_ne!(a, b);
    assert!(a.starts_with("larch_team_a_b_users_") && valid(&a), "{a}");
    assert!(b.starts_with("larch_team_a_b_users_") && valid(&b), "{b}");
    // Pinned: a changed derivation would orphan every existing slot.
    assert_eq!(a, "larch_team_a_b_users_0950b5f63001");
    assert_eq!(a, export_slot_name("team-a", "b-users", None));
    // Per table of a several-table export, and names that differ only past the cut.
    let t1 = export_slot_name("ns", "x", Some("public.a"));
    let t2 = export_slot_name("ns", "x", Some("public.b"));
    assert!(t1 != t2 && t1 != export_slot_name("ns", "x", None));
    let long = |last: char| {
        export_slot_name(
            &"n".repeat(63),
            &format!("{}{last}", "x".repeat(252)),
            Some("s.t"),
        )
    };
    assert!(long('a') != long('b') && valid(&long('a')), "{}", long('a'));
}

/// An upgraded operator keeps the slot an older one derived while the status records a writer
/// on it; anything else in status does not move the name.
#[test]
fn a_slot_recorded_in_status_under_the_old_name_is_kept() {
    use crate::crd::archive_export::{ArchiveExportStatus, WriterStatus};
    use crate::export::slot_names::slot_and_publication;
    let mut e = export_fixture("export-continuous-s3");
    let table = e.spec.source.all_tables()[0].clone();
    let new = export::derived_slot_name(&e, &table);
    assert_eq!(slot_and_publication(&e, &table), (new.clone(), new.clone()));
    let writer = |slot: &str| WriterStatus {
        table: table.qualified(),
        slot: Some(slot.into()),
        ..Default::default()
    };
    e.status = Some(ArchiveExportStatus {
        writers: vec![writer("larch_data_events")],
        ..Default::default()
    });
    assert_eq!(export::legacy_slot_name(&e, &table), "larch_data_events");
    assert_eq!(
        slot_and_publication(&e, &table),
        ("larch_data_events".into(), "larch_data_events".into())
    );
    e.status.as_mut().unwrap().writers = vec![writer("someone_elses_slot")];
    assert_eq!(slot_and_publication(&e, &table).0, new);
}

/// `split.workers`: the run's export Job is the coordinator (its request with `split`,
/// `splitWorkers` and the export's Lease), and an Indexed Job of that many workers runs `larch
/// export split-worker` with the same request, in the same pod as the export's (Secrets,
/// resources) but with no API token; a killed worker is retried per index, a must-act exit
/// fails its index (and the Job) at once.
#[test]
fn a_split_across_pods_runs_a_coordinator_and_an_indexed_job_of_workers() {
    use crate::export::split::{WORKER_CONTAINER, workers_job_name};
    let e = export_fixture("export-oneshot-split");
    let run = export::run_id(&e, None);
    let c = children(&e, Some(&run), &ctx());
    let names: Vec<&str> = c
        .jobs
        .iter()
        .map(|j| j.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        [format!("events-{run}"), format!("events-{run}-workers")]
    );
    let table = e.spec.source.all_tables()[0].clone();
    assert_eq!(workers_job_name(&e, &table, &run), names[1]);
    let (coordinator, workers) = (&c.jobs[0], &c.jobs[1]);
    let pod_of =
        |j: &k8s_openapi::api::batch::v1::Job| j.spec.clone().unwrap().template.spec.unwrap();
    let (cp, wp) = (pod_of(coordinator), pod_of(workers));
    let request = request_of(cp.containers[0].args.as_ref().unwrap());
    assert_eq!((request.split, request.split_workers), (Some(4), Some(2)));
    // One coordinator writes: it holds the export's Lease (the operator makes it, and a Role on
    // it for the exporter's account), and the Job starts no second one while one runs.
    assert_eq!(request.lease.as_deref(), Some("events"));
    let access = c
        .lease_access
        .as_ref()
        .expect("the Lease and the rights on it");
    let leases: Vec<_> = access
        .leases
        .iter()
        .map(|l| l.metadata.name.clone())
        .collect();
    assert_eq!(leases, [Some("events".to_string())]);
    let rule = &access.role.rules.as_ref().unwrap()[0];
    assert_eq!(
        rule.resource_names.as_deref(),
        Some(&["events".to_string()][..])
    );
    assert_eq!(rule.verbs, ["get", "update"]);
    assert_eq!(cp.service_account_name.as_deref(), Some("events-exporter"));
    assert_eq!(cp.automount_service_account_token, Some(true));
    let coordinator_spec = coordinator.spec.as_ref().unwrap();
    assert_eq!(coordinator_spec.parallelism, None, "one pod (the default)");
    assert_eq!(
        coordinator_spec.pod_replacement_policy.as_deref(),
        Some("Failed"),
        "a retried coordinator starts once the last one stopped"
    );
    let worker = &wp.containers[0];
    assert_eq!(worker.name, WORKER_CONTAINER);
    let args = worker.args.clone().unwrap();
    assert_eq!(
        args[..5],
        [
            "export",
            "split-worker",
            "--index",
            "$(JOB_COMPLETION_INDEX)",
            "--request"
        ]
    );
    assert_eq!(request_of(&args), request, "the coordinator's own request");
    let index = worker
        .env
        .iter()
        .flatten()
        .find(|v| v.name == "JOB_COMPLETION_INDEX");
    let field = index.and_then(|v| v.value_from.as_ref()?.field_ref.as_ref());
    assert_eq!(
        field.map(|f| f.field_path.as_str()),
        Some("metadata.annotations['batch.kubernetes.io/job-completion-index']")
    );
    // The same pod as the export's (volumes, mounts, resources, security), but no API access:
    // the spec's account, no token.
    assert_eq!(wp.service_account_name, e.spec.service_account_name);
    assert_eq!(wp.automount_service_account_token, Some(false));
    assert_eq!(wp.volumes, cp.volumes);
    assert_eq!(worker.volume_mounts, cp.containers[0].volume_mounts);
    assert_eq!(worker.resources, cp.containers[0].resources);
    assert_eq!(worker.security_context, cp.containers[0].security_context);
    assert_eq!(wp.restart_policy.as_deref(), Some("Never"));
    assert_eq!(worker.ports, None, "a worker serves nothing");
    let mounts: Vec<&str> = worker
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains(&"/etc/larch/source"), "{mounts:?}");
    assert!(mounts.contains(&"/etc/larch/transform-key"), "{mounts:?}");
    assert_restricted("split workers", &wp);
    let spec = workers.spec.as_ref().unwrap();
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
    assert_eq!((spec.completions, spec.parallelism), (Some(2), Some(2)));
    assert_eq!(
        spec.backoff_limit_per_index,
        Some(3),
        "spec.backoffLimit per worker"
    );
    assert_eq!(
        spec.max_failed_indexes,
        Some(0),
        "one failed worker fails the Job"
    );
    assert_eq!(
        spec.pod_replacement_policy.as_deref(),
        Some("Failed"),
        "a retried worker starts once its last pod stopped"
    );
    let rule = &spec.pod_failure_policy.as_ref().unwrap().rules[0];
    assert_eq!(rule.action, "FailIndex");
    let codes = rule.on_exit_codes.as_ref().unwrap();
    assert_eq!(
        (codes.container_name.as_deref(), codes.values.as_slice()),
        (
            Some(WORKER_CONTAINER),
            &[larch_core::failure::EXIT_PERMANENT][..]
        )
    );
    assert_eq!(
        spec.ttl_seconds_after_finished,
        coordinator
            .spec
            .as_ref()
            .unwrap()
            .ttl_seconds_after_finished
    );
    // Owned and labelled like the export Job: deleted with the CR, pruned by the finalizer.
    assert_eq!(
        workers.metadata.owner_references,
        coordinator.metadata.owner_references
    );
    assert_eq!(workers.metadata.labels, coordinator.metadata.labels);
}

/// `split` without workers: the export pod copies the ranges (`--split N`), one Job, also on
/// a schedule.
#[test]
fn a_split_without_workers_is_copied_inside_the_export_pod() {
    let mut e = export_fixture("export-oneshot-split");
    e.spec.split = Some(crate::crd::archive_export::ExportSplit {
        ranges: 8,
        workers: None,
    });
    let run = export::run_id(&e, None);
    let c = children(&e, Some(&run), &ctx());
    assert_eq!(c.jobs.len(), 1);
    let pod = c.jobs[0].spec.clone().unwrap().template.spec.unwrap();
    let r = request_of(pod.containers[0].args.as_ref().unwrap());
    assert_eq!((r.split, r.split_workers), (Some(8), None));
    e.spec.schedule = Some(crate::crd::archive_export::Schedule {
        cron: "@daily".into(),
        time_zone: None,
        suspend: None,
        concurrency_policy: None,
        successful_jobs_history_limit: None,
        failed_jobs_history_limit: None,
    });
    let c = children(&e, None, &ctx());
    let cron = &c.cron_jobs[0]
        .spec
        .job_template
        .spec
        .as_ref()
        .unwrap()
        .template;
    let r = request_of(
        cron.spec.as_ref().unwrap().containers[0]
            .args
            .as_ref()
            .unwrap(),
    );
    assert_eq!((r.split, r.split_workers), (Some(8), None));
    // Without split, no split in the request.
    let plain = export_fixture("export-oneshot-s3");
    let r = export::export_request(&plain, &plain.spec.source.all_tables()[0]);
    assert_eq!((r.split, r.split_workers), (None, None));
}

#[test]
fn completed_indexes_are_counted() {
    use crate::export::split::count_indexes;
    assert_eq!(count_indexes(""), 0);
    assert_eq!(count_indexes("0"), 1);
    assert_eq!(count_indexes("0-1"), 2);
    assert_eq!(count_indexes("0-2,5,7-8"), 6);
    assert_eq!(count_indexes("x,3-1"), 0);
}

/// A split run ends with its coordinator's success (it committed) once its workers are done
/// (whatever their Job says), at once with a failed Job, and waits while neither happened.
#[test]
fn a_split_runs_outcome_is_its_coordinators_or_a_failure() {
    use crate::export::split::run_outcome;
    use crate::reconcile::job::JobPhase::*;
    assert_eq!(run_outcome(&[Succeeded, Active]), None);
    assert_eq!(run_outcome(&[Succeeded, Failed]), Some(true));
    assert_eq!(run_outcome(&[Succeeded, Missing]), Some(true));
    assert_eq!(run_outcome(&[Succeeded, Succeeded]), Some(true));
    assert_eq!(run_outcome(&[Active, Failed]), Some(false));
    assert_eq!(run_outcome(&[Failed, Active]), Some(false));
    assert_eq!(run_outcome(&[Active, Active]), None);
    assert_eq!(run_outcome(&[Active, Succeeded]), None);
    assert_eq!(run_outcome(&[Missing, Succeeded]), Some(false));
}
