//! One-shot exports and the sources that serve them: scenarios 3 (export to S3), 4 (an
//! ArchiveSource serving it), 6 (a replacement re-baselines the engine) and 16 (scheduled runs
//! keep two epochs).

use std::time::Duration;

use serde_json::Value;

use super::helpers::{
    archive_args, export_manifest, get_cr, oneshot_exported, source_manifest, wait_engine_matches,
    wait_export_succeeded, wait_source_ready,
};
use super::support::{condition_is, env, env_with_operator, serial};

/// Scenario 3: A OneShot ArchiveExport to SeaweedFS: the Job succeeds, the archive verifies, the status
/// says LastExportSucceeded=True with the position and the table's row count.
#[test]
fn s03_oneshot_export_to_s3() {
    let _g = serial();
    let o = oneshot_exported();
    let e = env();
    let ns = "e2e-oneshot";
    let jobs = e.list(&["jobs", "-n", ns, "-l", "larch.dev/archive-export=events"]);
    assert_eq!(jobs.len(), 1, "one Job");
    assert_eq!(jobs[0]["status"]["succeeded"], 1, "{}", jobs[0]["status"]);
    assert!(condition_is(&jobs[0], "Complete", "True"));

    let count: i64 = e.sql("SELECT count(*) FROM public.events").parse().unwrap();
    let last = &o["status"]["lastExport"];
    assert_eq!(last["rowCount"].as_i64(), Some(count), "{last}");
    let position = last["position"].as_str().expect("position");
    assert!(
        larch::archive::position::Lsn::parse(position).is_some(),
        "an LSN: {position}"
    );
    let key_prefix = last["keyPrefix"].as_str().unwrap_or("public.events/");
    e.larch(&archive_args(e, &["verify"], "oneshot", key_prefix));
    let text = e.larch(&archive_args(
        e,
        &["inspect", "--json"],
        "oneshot",
        key_prefix,
    ));
    assert!(
        text.contains(position),
        "the manifest holds position {position}: {text}"
    );
    assert!(text.contains(&count.to_string()), "{text}");
}

/// Scenario 4: An ArchiveSource with exportRef: the engine becomes Ready and its HTTP API, page by page,
/// returns exactly the table's rows; the status reports the export's position, caught up.
#[test]
fn s04_source_exportref_serves_the_table() {
    let _g = serial();
    oneshot_exported();
    let e = env();
    let ns = "e2e-oneshot";
    e.apply(&source_manifest(ns, "events-cache", "events"));
    let o = wait_source_ready(e, ns, "events-cache");
    assert_eq!(o["status"]["readyReplicas"].as_i64(), Some(1), "{o}");
    wait_engine_matches(e, ns, "events-cache", "events");
    // The engines report the archive's head: the export's position.
    let position = oneshot_exported()["status"]["lastExport"]["position"].clone();
    e.wait_for(ns, "status.position at the export's position", 90, || {
        let o = get_cr(e, "archivesource", ns, "events-cache");
        (o["status"]["position"] == position && condition_is(&o, "CaughtUp", "True")).then_some(())
    });
}

/// Scenario 6: A replacement: a new one-shot run over the archive (new epoch). The engine re-baselines
/// once (`status.rebaselines.total` + 1, `Rebaselining=True`, an Event) and serves the new rows
/// only.
#[test]
fn s06_replacement_rebaselines() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-replace";
    e.sql(
        "DROP TABLE IF EXISTS public.replaced; \
         CREATE TABLE public.replaced AS SELECT * FROM public.events WHERE id <= 300; \
         ALTER TABLE public.replaced ADD PRIMARY KEY (id)",
    );
    e.namespace(ns, &[]);
    e.bucket("replace");
    e.apply(&export_manifest(
        e, ns, "replaced", "replaced", "OneShot", "replace",
    ));
    let first = wait_export_succeeded(e, ns, "replaced", None);
    e.apply(&source_manifest(ns, "replaced-cache", "replaced"));
    wait_source_ready(e, ns, "replaced-cache");
    wait_engine_matches(e, ns, "replaced-cache", "replaced");
    let before = get_cr(e, "archivesource", ns, "replaced-cache")["status"]["rebaselines"]["total"]
        .as_i64()
        .unwrap_or(0);

    // New content, then a new run.
    e.sql(
        "DELETE FROM public.replaced WHERE id <= 100; \
         UPDATE public.replaced SET tenant = 'moved', amount = 1.25 WHERE id BETWEEN 101 AND 150; \
         INSERT INTO public.replaced SELECT id + 10000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events WHERE id <= 50",
    );
    let run = first["status"]["run"]["id"].as_str().map(str::to_string);
    e.kubectl(&[
        "annotate",
        "archiveexport",
        "replaced",
        "-n",
        ns,
        "--overwrite",
        "larch.dev/run-requested=second",
    ]);
    wait_export_succeeded(e, ns, "replaced", run.as_deref());

    let o = e.wait_for(
        ns,
        "rebaselines.total + 1 and Rebaselining=True",
        240,
        || {
            let o = e.get(&["archivesource", "replaced-cache", "-n", ns])?;
            let total = o["status"]["rebaselines"]["total"].as_i64().unwrap_or(0);
            (total == before + 1 && condition_is(&o, "Rebaselining", "True")).then_some(o)
        },
    );
    assert!(o["status"]["rebaselines"]["lastTime"].is_string(), "{o}");
    wait_engine_matches(e, ns, "replaced-cache", "replaced");
    e.wait_for(ns, "a re-baseline Event", 60, || {
        let events = e.list(&["events", "-n", ns]);
        events
            .iter()
            .find(|ev| {
                ev["involvedObject"]["name"] == "replaced-cache" && ev["reason"] == "Rebaselining"
            })
            .cloned()
    });
    // Exactly one: the total does not move further.
    std::thread::sleep(Duration::from_secs(10));
    let o = get_cr(e, "archivesource", ns, "replaced-cache");
    assert_eq!(
        o["status"]["rebaselines"]["total"].as_i64(),
        Some(before + 1),
        "{o}"
    );
}

/// Scenario 16: a Scheduled export run four times with `retention.keepEpochs: 2` leaves exactly
/// two epochs' objects in SeaweedFS.
#[test]
fn s16_scheduled_runs_keep_two_epochs() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-retention";
    e.namespace(ns, &[]);
    e.bucket("retention");
    let mut m = export_manifest(e, ns, "kept", "events", "OneShot", "retention");
    m.push_str(
        "  schedule: {cron: \"0 0 1 1 *\"}\n  retention: {keepEpochs: 2}\n  keyPrefix: kept/\n",
    );
    e.apply(&m);
    let mut last: Option<String> = None;
    for run in 1..=4 {
        e.kubectl(&[
            "annotate",
            "archiveexport",
            "kept",
            "-n",
            ns,
            "--overwrite",
            &format!("larch.dev/run-requested=run-{run}"),
        ]);
        let id = e.wait_for(ns, &format!("run {run} succeeded"), 180, || {
            let o = e.get(&["archiveexport", "kept", "-n", ns])?;
            let r = &o["status"]["run"];
            let id = r["id"].as_str()?.to_string();
            (Some(&id) != last.as_ref() && r["succeeded"] == true).then_some(id)
        });
        last = Some(id);
    }
    let keys = e.s3_keys("retention", "kept/");
    let mut epochs: Vec<&str> = keys
        .iter()
        .filter_map(|k| k.split('/').find(|p| p.starts_with("epoch=")))
        .collect();
    epochs.sort();
    epochs.dedup();
    assert_eq!(epochs, ["epoch=3", "epoch=4"], "{keys:?}");
    let text = e.larch(&archive_args(
        e,
        &["inspect", "--json"],
        "retention",
        "kept/",
    ));
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["epoch"], 4);
    e.larch(&archive_args(e, &["verify"], "retention", "kept/"));
}
