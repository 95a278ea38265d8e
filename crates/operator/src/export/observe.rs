//! Parsers for what the operator reads from its pods: the export summary (termination message),
//! a Continuous writer's `/status`, an engine's `/status` and `/metrics`. Pure; the controllers
//! fetch, these interpret. Malformed input yields `None`, never a panic.

use serde::Deserialize;

use crate::crd::archive_export::{ExportSummary, RestorableWindow, WriterStatus};
use larch_core::progress::ProgressReport;

/// The JSON summary `larch export` writes to `/dev/termination-log`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
struct SummaryJson {
    table: String,
    #[serde(default)]
    key_prefix: Option<String>,
    #[serde(default)]
    position: Option<String>,
    #[serde(default)]
    row_count: Option<i64>,
    #[serde(default)]
    epoch: Option<i64>,
}

/// The summary of an export of several tables at one position: one entry per table.
#[derive(Deserialize, Debug)]
struct SetSummaryJson {
    tables: Vec<SummaryJson>,
}

/// The last JSON object of `message` that parses as `T` (the exporter may print more).
fn last_json<T: serde::de::DeserializeOwned>(message: &str) -> Option<T> {
    serde_json::from_str(message.trim()).ok().or_else(|| {
        message
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l.trim()).ok())
    })
}

/// Every table's summary in a termination message: a set's (several tables at one position)
/// or a single table's ([`parse_summary`]); none when it holds neither.
pub fn parse_summaries(
    message: &str,
    time: Option<String>,
    pod: Option<String>,
) -> Vec<ExportSummary> {
    match last_json::<SetSummaryJson>(message) {
        Some(set) => set
            .tables
            .into_iter()
            .map(|s| summary_of(s, time.clone(), pod.clone()))
            .collect(),
        None => parse_summary(message, time, pod).into_iter().collect(),
    }
}

/// Parses an export summary; `time` and `pod` are the container's finish time and pod name.
pub fn parse_summary(
    message: &str,
    time: Option<String>,
    pod: Option<String>,
) -> Option<ExportSummary> {
    Some(summary_of(last_json(message)?, time, pod))
}

fn summary_of(s: SummaryJson, time: Option<String>, pod: Option<String>) -> ExportSummary {
    ExportSummary {
        table: s.table,
        key_prefix: s.key_prefix,
        position: s.position,
        row_count: s.row_count,
        epoch: s.epoch,
        time,
        pod,
    }
}

#[derive(Deserialize, Debug)]
struct WriterJson {
    table: String,
    #[serde(default)]
    epoch: Option<i64>,
    #[serde(default)]
    head_position: Option<String>,
    #[serde(default)]
    buffer_depth: Option<i64>,
    #[serde(default)]
    last_snapshot_at: Option<String>,
    #[serde(default)]
    slot: Option<SlotJson>,
    #[serde(default)]
    slot_losses: Option<i64>,
    #[serde(default)]
    last_slot_loss: Option<SlotLossJson>,
    #[serde(default)]
    restorable: Option<WindowJson>,
}

#[derive(Deserialize, Debug)]
struct WindowJson {
    earliest_position: String,
    #[serde(default)]
    earliest_time: Option<String>,
    latest_position: String,
    #[serde(default)]
    latest_time: Option<String>,
}

/// A replication slot as exporters and `larch export slot-status` report it.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SlotJson {
    pub name: String,
    #[serde(default)]
    pub exists: bool,
    #[serde(default)]
    pub wal_status: Option<String>,
    #[serde(default)]
    pub retained_wal_bytes: Option<i64>,
    #[serde(default)]
    pub lag_bytes: Option<i64>,
}

#[derive(Deserialize, Debug)]
struct SlotLossJson {
    #[serde(default)]
    at: String,
    #[serde(default)]
    reason: String,
}

/// Parses a Continuous writer's `/status`.
pub fn parse_writer_status(body: &str) -> Option<WriterStatus> {
    let w: WriterJson = serde_json::from_str(body).ok()?;
    let mut out = WriterStatus {
        table: w.table,
        // 0 until the writer has opened the archive (epochs start at 1): not an epoch yet.
        epoch: w.epoch.filter(|e| *e > 0),
        head_position: w.head_position,
        buffer_depth: w.buffer_depth,
        last_snapshot_at: w.last_snapshot_at,
        slot_losses: w.slot_losses,
        last_slot_loss: w.last_slot_loss.map(|l| {
            format!("{} (at {})", l.reason, l.at)
                .chars()
                .take(1024)
                .collect()
        }),
        restorable: w.restorable.map(|r| RestorableWindow {
            earliest_position: r.earliest_position,
            earliest_time: r.earliest_time,
            latest_position: r.latest_position,
            latest_time: r.latest_time,
        }),
        ..Default::default()
    };
    if let Some(slot) = &w.slot {
        set_slot(&mut out, slot);
    }
    Some(out)
}

/// Copies a slot report into a writer's status.
pub fn set_slot(w: &mut WriterStatus, slot: &SlotJson) {
    w.slot = Some(slot.name.clone());
    w.retained_wal_bytes = slot.retained_wal_bytes.filter(|_| slot.exists);
    w.lag_bytes = slot.lag_bytes.filter(|_| slot.exists);
    w.wal_status = if slot.exists {
        slot.wal_status.clone()
    } else {
        Some("missing".into())
    };
}

/// What the slot monitor of a suspended export reports: the slots and when they were read.
#[derive(Debug, Deserialize)]
pub struct SlotReport {
    #[serde(default)]
    pub observed_at: Option<String>,
    pub slots: Vec<SlotJson>,
}

/// Parses `larch export slot-status`'s `/status` (the slot monitor of a suspended export):
/// the slots and when they were read. `None` for any other document.
pub fn parse_slot_monitor(body: &str) -> Option<SlotReport> {
    serde_json::from_str(body).ok()
}

/// A column a masked writer's rules do not name, as its `/status` reports it.
#[derive(Deserialize, Debug)]
struct UnreviewedJson {
    table: String,
    column: String,
    #[serde(default)]
    applied: String,
    #[serde(default)]
    suggestion: String,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize, Debug)]
struct WriterUnreviewedJson {
    #[allow(dead_code)]
    table: String,
    #[serde(default)]
    unreviewed_columns: Vec<UnreviewedJson>,
}

/// The columns a masked writer's `/status` reports its rules do not name, each as
/// `table.column (now: RULE; suggested: RULE, REASON)`; None for a body that is no writer's.
pub fn parse_unreviewed(body: &str) -> Option<Vec<String>> {
    let w: WriterUnreviewedJson = serde_json::from_str(body).ok()?;
    Some(
        w.unreviewed_columns
            .into_iter()
            .map(|u| {
                let line = format!(
                    "{}.{} (now: {}; suggested: {}, {})",
                    u.table, u.column, u.applied, u.suggestion, u.reason
                );
                line.chars().take(256).collect()
            })
            .collect(),
    )
}

#[derive(Deserialize, Debug)]
struct PreflightJson {
    #[serde(default)]
    preflight: Option<larch_contract::preflight::PreflightSummary>,
}

/// The constraint preflight an export pod reports: the `preflight` of its summary (a
/// termination message) or of a writer's `/status`; None when it reports none.
pub fn parse_preflight(body: &str) -> Option<larch_contract::preflight::PreflightSummary> {
    last_json::<PreflightJson>(body)?.preflight
}

#[derive(Deserialize, Debug)]
struct ExporterProgressJson {
    #[serde(default)]
    progress: Option<ProgressReport>,
}

/// The snapshot an exporter (one-shot or continuous) is writing, else its last one: the
/// `progress` of its `/status`. `None` when it has none (or the body is no exporter's).
pub fn parse_export_progress(body: &str) -> Option<ProgressReport> {
    serde_json::from_str::<ExporterProgressJson>(body)
        .ok()?
        .progress
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::progress::Behind;
    use crate::source::observe::{parse_engine_progress, parse_engine_rows, parse_engine_status};

    #[test]
    fn summary_from_termination_message() {
        let msg = r#"{"key_prefix": "public.users/", "position": "0/016B3748", "row_count": 3, "table": "public.users", "epoch": 2}"#;
        let s = parse_summary(msg, Some("t".into()), Some("p".into())).unwrap();
        assert_eq!(s.table, "public.users");
        assert_eq!(s.key_prefix.as_deref(), Some("public.users/"));
        assert_eq!(s.position.as_deref(), Some("0/016B3748"));
        assert_eq!((s.row_count, s.epoch), (Some(3), Some(2)));
        assert_eq!(
            (s.time.as_deref(), s.pod.as_deref()),
            (Some("t"), Some("p"))
        );
        let noisy = format!("starting\n{msg}\n");
        assert_eq!(
            parse_summary(&noisy, None, None).unwrap().row_count,
            Some(3)
        );
        assert!(parse_summary("panic: boom", None, None).is_none());
        assert!(parse_summary("", None, None).is_none());
        assert_eq!(parse_summaries(&noisy, None, None).len(), 1);
        assert!(parse_summaries("panic: boom", None, None).is_empty());
    }

    #[test]
    fn a_set_summary_gives_every_table() {
        let msg = r#"{"position":"0/16B3748","tables":[{"epoch":1,"key_prefix":"n/public.a/","position":"0/16B3748","row_count":3,"table":"public.a"},{"epoch":4,"key_prefix":"n/sales.b/","position":"0/16B3748","row_count":0,"table":"sales.b"}]}"#;
        let all = parse_summaries(msg, Some("t".into()), Some("p".into()));
        let got: Vec<String> = all
            .iter()
            .map(|s| {
                format!(
                    "{} {:?} {:?} {:?}",
                    s.table, s.key_prefix, s.row_count, s.epoch
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                r#"public.a Some("n/public.a/") Some(3) Some(1)"#,
                r#"sales.b Some("n/sales.b/") Some(0) Some(4)"#,
            ]
        );
        assert!(
            all.iter()
                .all(|s| s.position.as_deref() == Some("0/16B3748"))
        );
        assert!(all.iter().all(|s| s.pod.as_deref() == Some("p")));
    }

    #[test]
    fn progress_of_exporters_and_engines() {
        // What `larch export --listen` serves while it copies (ExportStatus).
        let exporter = r#"{"table":"public.events","state":"BASELINE","epoch":0,"progress":{"operation":"baseline","subject":"public.events","rows":120,"bytes":9000,"total_rows":200,"percent":60.0,"rows_per_second":40.0,"bytes_per_second":3000.0,"eta_seconds":2.0,"elapsed_seconds":3.0,"started_at":"2027-01-15T08:00:00Z","done":false}}"#;
        let r = parse_export_progress(exporter).unwrap();
        assert_eq!((r.rows, r.total_rows, r.done), (120, Some(200), false));
        assert!(parse_export_progress(r#"{"table":"public.events","progress":null}"#).is_none());
        assert!(parse_export_progress("<html>").is_none());
        // An engine: two pipelines of one source report the same load once; a group's members
        // add up; other sources are not ours.
        let load = |rows: u64, total: u64| {
            format!(
                r#"{{"operation":"baseline","subject":"s","rows":{rows},"bytes":0,"total_rows":{total},"percent":null,"rows_per_second":10.0,"bytes_per_second":0.0,"eta_seconds":null,"elapsed_seconds":1.0,"started_at":"t","done":false}}"#
            )
        };
        let engine = format!(
            r#"{{"sources":{{}},"pipelines":{{"a":{{"source":"g/public.a","baseline_progress":{}}},"a2":{{"source":"g/public.a","baseline_progress":{}}},"b":{{"source":"g/public.b","baseline_progress":{}}},"x":{{"source":"gx","baseline_progress":{}}}}}}}"#,
            load(10, 100),
            load(10, 100),
            load(5, 50),
            load(999, 999)
        );
        let r = parse_engine_progress(&engine, "g").unwrap();
        assert_eq!((r.rows, r.total_rows), (15, Some(150)));
        assert_eq!(r.rows_per_second, 20.0);
        assert!(parse_engine_progress(&engine, "other").is_none());
    }

    #[test]
    fn writer_and_engine_status() {
        let w = parse_writer_status(
            r#"{"table":"public.events","epoch":4,"head_position":"0/1A","buffer_depth":12,"last_snapshot_at":"2026-11-29T08:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!((w.epoch, w.buffer_depth), (Some(4), Some(12)));
        assert_eq!(w.head_position.as_deref(), Some("0/1A"));
        assert!(parse_writer_status("not json").is_none());
        // Before the writer opened the archive: no epoch to show.
        let starting = parse_writer_status(r#"{"table":"public.events","epoch":0}"#).unwrap();
        assert_eq!(starting.epoch, None);
        let w = parse_writer_status(
            r#"{"table":"public.events","epoch":4,"slot":{"name":"larch_a","exists":true,"wal_status":"reserved","retained_wal_bytes":81920,"lag_bytes":56},"slot_losses":1,"last_slot_loss":{"at":"t","reason":"replication slot larch_a was invalidated"}}"#,
        )
        .unwrap();
        assert_eq!(w.slot.as_deref(), Some("larch_a"));
        assert_eq!((w.retained_wal_bytes, w.lag_bytes), (Some(81920), Some(56)));
        assert_eq!(w.wal_status.as_deref(), Some("reserved"));
        assert_eq!(w.slot_losses, Some(1));
        assert!(w.last_slot_loss.unwrap().contains("invalidated"));
        assert_eq!(w.restorable, None);
        let w = parse_writer_status(
            r#"{"table":"public.events","epoch":2,"restorable":{"earliest_position":"0/10","earliest_time":"2026-11-30T14:00:00Z","latest_position":"0/30"}}"#,
        )
        .unwrap();
        assert_eq!(
            w.restorable,
            Some(RestorableWindow {
                earliest_position: "0/10".into(),
                earliest_time: Some("2026-11-30T14:00:00Z".into()),
                latest_position: "0/30".into(),
                latest_time: None,
            })
        );
        let SlotReport {
            slots,
            observed_at: at,
        } = parse_slot_monitor(
            r#"{"server":"db:5432/app as user u","observed_at":"2026-12-01T10:00:00Z","slots":[{"name":"larch_a","exists":true,"retained_wal_bytes":4096},{"name":"larch_b","exists":false}],"last_error":null}"#,
        )
        .unwrap();
        assert_eq!(
            (slots.len(), at.as_deref()),
            (2, Some("2026-12-01T10:00:00Z"))
        );
        let mut w = WriterStatus::default();
        set_slot(&mut w, &slots[1]);
        assert_eq!(
            (w.retained_wal_bytes, w.wal_status.as_deref()),
            (None, Some("missing"))
        );
        assert!(parse_slot_monitor(r#"{"table":"public.events"}"#).is_none());
        let body = r#"{"sources":{"seed":{"state":"following","position":"0/10","head":"0/12","epoch":1,"lag_seconds":2.5,"rebaselines":1},"other":{}}}"#;
        let e = &parse_engine_status(body, "seed").unwrap()[0];
        assert_eq!(e.state.as_deref(), Some("following"));
        assert_eq!(e.lag_seconds, Some(2.5));
        assert_eq!(e.rebaselines, Some(1));
        assert_eq!(e.short_chain, None);
        let short = r#"{"sources":{"seed":{"position":"0/20","head":"0/40","short_chain":{"reached":"0/20","head":"0/40","reason":"no diff starts at 0/20"}}}}"#;
        let e = &parse_engine_status(short, "seed").unwrap()[0];
        assert_eq!(
            e.short_chain
                .as_ref()
                .map(|s| (s.reached.as_str(), s.head.as_str())),
            Some(("0/20", "0/40"))
        );
        assert!(parse_engine_status(body, "missing").unwrap().is_empty());
        let pinned = r#"{"sources":{"seed":{"position":"0/20","at":{"requested":"2026-11-30T14:00:25Z","position":"0/20","time":"2026-11-30T14:00:20Z","precision":"transaction","notice":null}}}}"#;
        let e = &parse_engine_status(pinned, "seed").unwrap()[0];
        let at = e.at.as_ref().unwrap();
        assert_eq!(
            (
                at.position.as_deref(),
                at.time.as_deref(),
                at.precision.as_deref()
            ),
            (
                Some("0/20"),
                Some("2026-11-30T14:00:20Z"),
                Some("transaction")
            )
        );
        assert_eq!(e.behind, None, "an engine without `behind`");
        let caught_up = r#"{"sources":{"seed":{"behind":{"diffs":0,"bytes":0,"seconds":0.0},"lag_seconds":900.0}}}"#;
        assert_eq!(
            parse_engine_status(caught_up, "seed").unwrap()[0].behind,
            Some(Behind::default())
        );
        assert!(parse_engine_status("<html>", "seed").is_none());
        let with_pipelines = r#"{"sources":{},"pipelines":{"p1":{"source":"seed","row_count":3},"p2":{"source":"seed","row_count":4},"p3":{"source":"other","row_count":9}}}"#;
        assert_eq!(parse_engine_rows(with_pipelines, "seed"), Some(7));
        assert_eq!(parse_engine_rows(with_pipelines, "none"), None);
        let group = r#"{"sources":{"g/public.a":{"lag_seconds":1.0},"g/sales.b":{"lag_seconds":9.0},"gx":{},"g":{}}}"#;
        assert_eq!(
            parse_engine_status(group, "g").unwrap().len(),
            3,
            "g itself and its two members, not gx"
        );
    }
}
