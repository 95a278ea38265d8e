//! Issue 13, what an ArchiveExport leaves on the source database: scenarios 13 (delete drops the
//! slot and the publication), 14 (the same once PostgreSQL is back) and 15 (suspend keeps the
//! slot, `deletionPolicy: Retain` keeps it after delete).

use super::helpers::{
    archive_row_count, continuous_export_of_copy, events_of, get_cr, publication_count, slot_count,
    writer_pods,
};
use super::support::{Env, condition, env_with_operator, serial};

/// The replication slot and publication names the operator derives for `ns`/`name`.
fn derived_slot(ns: &str, name: &str) -> String {
    larch::operator::export::build::export_slot_name(ns, name, None)
}

/// Scenario 13: deleting a Continuous ArchiveExport drops its replication slot and publication
/// (the finalizer's cleanup Job), within 60 s; the time is printed.
#[test]
fn s13_delete_drops_the_slot_and_the_publication() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-delete";
    continuous_export_of_copy(e, ns, "dropped", 200, "delete");
    let slot = derived_slot(ns, "dropped");
    e.wait_for(ns, "the writer's slot and publication", 60, || {
        (slot_count(e, &slot) == 1 && publication_count(e, &slot) == 1).then_some(())
    });
    // The record cleanup goes by.
    assert_eq!(
        e.sql(&format!(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = '{slot}'"
        )),
        format!("larch: created for replication slot {slot} by archiveexport/{ns}/dropped")
    );
    let o = get_cr(e, "archiveexport", ns, "dropped");
    assert_eq!(
        o["metadata"]["finalizers"],
        serde_json::json!(["larch.dev/cleanup"])
    );
    let t0 = std::time::Instant::now();
    e.kubectl(&[
        "delete",
        "archiveexport",
        "dropped",
        "-n",
        ns,
        "--wait=false",
    ]);
    e.wait_for(ns, "slot and publication dropped", 60, || {
        (slot_count(e, &slot) == 0 && publication_count(e, &slot) == 0).then_some(())
    });
    let dropped = t0.elapsed();
    e.wait_for(ns, "the ArchiveExport gone", 60, || {
        e.get(&["archiveexport", "dropped", "-n", ns])
            .is_none()
            .then_some(())
    });
    eprintln!(
        "e2e s13: delete → slot gone in {:.1}s, ArchiveExport gone in {:.1}s",
        dropped.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    let ok = events_of(e, ns, "dropped", "CleanupSucceeded");
    assert!(!ok.is_empty(), "a CleanupSucceeded Event");
    // The operator deletes the Job right after it lets the object go.
    e.wait_for(ns, "the cleanup Job removed", 60, || {
        e.list(&[
            "jobs",
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/component=cleanup",
        ])
        .is_empty()
        .then_some(())
    });
    assert_eq!(
        ok.len(),
        1,
        "one cleanup, so one CleanupSucceeded Event: {ok:?}"
    );
}

/// Scenario 14: deleting while PostgreSQL is down: `CleanupFailed` (condition and Event with
/// the error), retried; once PostgreSQL is back the slot and publication go, then the object.
#[test]
fn s14_delete_while_postgres_is_down_cleans_up_once_it_is_back() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-delete-down";
    continuous_export_of_copy(e, ns, "unreachable", 100, "delete-down");
    let slot = derived_slot(ns, "unreachable");
    e.wait_for(ns, "the writer's slot", 60, || {
        (slot_count(e, &slot) == 1).then_some(())
    });
    /// Starts PostgreSQL again however the scenario ends: the next ones need it.
    struct Restart<'a>(&'a Env, bool);
    impl Restart<'_> {
        fn now(&mut self) {
            if !std::mem::replace(&mut self.1, true) {
                self.0.pg_start();
            }
        }
    }
    impl Drop for Restart<'_> {
        fn drop(&mut self) {
            self.now();
        }
    }
    e.pg_stop();
    let mut restart = Restart(e, false);
    e.kubectl(&[
        "delete",
        "archiveexport",
        "unreachable",
        "-n",
        ns,
        "--wait=false",
    ]);
    let failed = e.wait_for(ns, "CleanupFailed", 180, || {
        let o = e.get(&["archiveexport", "unreachable", "-n", ns])?;
        let ready = condition(&o, "Ready")?;
        (ready["reason"] == "CleanupFailed").then(|| o.clone())
    });
    let message = condition(&failed, "Ready").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    let events = events_of(e, ns, "unreachable", "CleanupFailed");
    restart.now();
    let back = std::time::Instant::now();
    assert!(
        message.contains("cannot connect to PostgreSQL")
            && message.contains("larch.dev/skip-cleanup"),
        "{message}"
    );
    assert!(!events.is_empty(), "a CleanupFailed Event");
    assert!(
        failed["status"]["cleanup"]["lastError"]
            .as_str()
            .unwrap()
            .contains("cannot connect"),
        "{}",
        failed["status"]
    );
    assert_eq!(slot_count(e, &slot), 1, "nothing dropped while down");
    e.wait_for(
        ns,
        "slot and publication dropped after the restart",
        180,
        || (slot_count(e, &slot) == 0 && publication_count(e, &slot) == 0).then_some(()),
    );
    eprintln!(
        "e2e s14: PostgreSQL back → slot gone in {:.1}s (the next retry after its backoff)",
        back.elapsed().as_secs_f64()
    );
    e.wait_for(ns, "the ArchiveExport gone", 60, || {
        e.get(&["archiveexport", "unreachable", "-n", ns])
            .is_none()
            .then_some(())
    });
}

/// Scenario 15: suspend keeps the slot (so resume continues) and status shows the WAL it holds
/// growing under writes; resume continues from the slot; with `deletionPolicy: Retain` the
/// slot and publication outlive the ArchiveExport.
#[test]
fn s15_suspend_keeps_the_slot_and_retain_keeps_it_after_delete() {
    let _g = serial();
    let e = env_with_operator();
    let ns = "e2e-suspend";
    continuous_export_of_copy(e, ns, "paused", 300, "suspend");
    let slot = derived_slot(ns, "paused");
    let epoch = e.wait_for(ns, "the writer's slot in status", 120, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        let w = &o["status"]["writers"][0];
        (w["slot"] == slot.as_str() && w["retainedWalBytes"].is_i64())
            .then(|| w["epoch"].as_i64().unwrap())
    });
    e.kubectl(&[
        "patch",
        "archiveexport",
        "paused",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"suspend":true}}"#,
    ]);
    let at_suspension = e.wait_for(ns, "the WAL held at suspension in status", 180, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        let w = &o["status"]["writers"][0];
        let ready = condition(&o, "Ready")?;
        (ready["reason"] == "Suspended"
            && writer_pods(e, ns, "paused")
                .iter()
                .all(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] != "export"))
        .then(|| w["retainedWalBytesAtSuspension"].as_i64())
        .flatten()
    });
    assert_eq!(slot_count(e, &slot), 1, "suspend keeps the slot");
    // Writes while suspended: the slot holds more and more WAL.
    e.sql(
        "INSERT INTO public.paused SELECT id + 100000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events; \
         INSERT INTO public.paused SELECT id + 200000, tenant, kind, amount, payload, created_at, \
           tags, flag, ref, blob FROM public.events",
    );
    let grown = e.wait_for(ns, "the retained WAL growing in status", 180, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        let w = &o["status"]["writers"][0];
        let now = w["retainedWalBytes"].as_i64()?;
        (now > at_suspension + 100_000).then(|| (now, o.clone()))
    });
    let message = condition(&grown.1, "Ready").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains(&format!(
            "replication slot {slot} is kept so resume continues"
        )) && message.contains("at suspension"),
        "{message}"
    );
    let sql_retained: i64 = e
        .sql(&format!(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .parse()
        .unwrap();
    eprintln!(
        "e2e s15: WAL held by the suspended slot: {at_suspension} B at suspension, {} B in status after the writes ({sql_retained} B per pg_replication_slots now)",
        grown.0
    );
    assert!(sql_retained >= grown.0, "status never over-reports");

    // Resume: the same epoch continues from the slot and catches up on the writes.
    e.kubectl(&[
        "patch",
        "archiveexport",
        "paused",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"suspend":false}}"#,
    ]);
    let table: i64 = e.sql("SELECT count(*) FROM public.paused").parse().unwrap();
    e.wait_for(
        ns,
        "the resumed writer to hold the suspended writes",
        180,
        || (archive_row_count(e, "suspend", "public.paused/") == table).then_some(()),
    );
    // The resumed writer reports its epoch a little after it starts writing.
    let resumed = e.wait_for(ns, "the resumed writer's epoch in status", 120, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        o["status"]["writers"][0]["epoch"].as_i64()
    });
    assert_eq!(resumed, epoch, "resumed, no new baseline");
    e.wait_for(ns, "the slot monitor gone", 60, || {
        e.get(&["deployment", "paused-slot-monitor", "-n", ns])
            .is_none()
            .then_some(())
    });

    // Retain: the finalizer goes, and the slot and publication stay after the delete.
    e.kubectl(&[
        "patch",
        "archiveexport",
        "paused",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"source":{"deletionPolicy":"Retain"}}}"#,
    ]);
    e.wait_for(ns, "the finalizer removed", 60, || {
        let o = e.get(&["archiveexport", "paused", "-n", ns])?;
        o["metadata"]["finalizers"].is_null().then_some(())
    });
    e.kubectl(&["delete", "archiveexport", "paused", "-n", ns]);
    e.wait_for(ns, "the writer gone", 120, || {
        writer_pods(e, ns, "paused").is_empty().then_some(())
    });
    assert_eq!((slot_count(e, &slot), publication_count(e, &slot)), (1, 1));
    // What the operator would have run: the CLI drops them.
    let out = e.larch(&[
        "export",
        "cleanup",
        "--connection",
        &e.pg_dsn,
        "--slot",
        &slot,
        "--owner",
        &format!("archiveexport/{ns}/paused"),
    ]);
    assert!(out.contains(r#""outcome":"dropped""#), "{out}");
    assert_eq!((slot_count(e, &slot), publication_count(e, &slot)), (0, 0));
}
