//! `larch status` (also `kubectl larch status`, the binary installed as `kubectl-larch`): every
//! ArchiveExport, ArchiveSource and ArchiveSourceSet of the cluster on one screen, with the
//! recent warning Events about them, read with the user's kubeconfig.

use std::fmt::Write as _;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::operator::crd::common::{Condition, ConditionStatus};
use crate::operator::crd::progress::OperationProgress;
use crate::operator::crd::{ArchiveExport, ArchiveSource, ArchiveSourceSet};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only this namespace (default: every namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// `table` (one screen) or `json`.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
    /// Warning Events to show (newest first).
    #[arg(long, default_value_t = 10)]
    pub events: usize,
}

#[derive(Debug, Default, Serialize)]
pub struct Overview {
    pub exports: Vec<ExportLine>,
    pub sources: Vec<SourceLine>,
    pub source_sets: Vec<SourceSetLine>,
    pub warnings: Vec<WarningLine>,
}

#[derive(Debug, Serialize)]
pub struct ExportLine {
    pub namespace: String,
    pub name: String,
    pub mode: String,
    pub ready: String,
    /// Why it is not Ready (the Ready condition's reason).
    pub reason: Option<String>,
    pub last_export: Option<String>,
    pub position: Option<String>,
    pub epoch: Option<i64>,
    pub rows: Option<i64>,
    /// The cron of a scheduled OneShot export (`suspended` when suspended).
    pub schedule: Option<String>,
    /// The run in progress or the last one: `running`, `succeeded`, `failed`.
    pub run: Option<String>,
    /// When the schedule fires next (RFC 3339 UTC; the schedule's `timeZone`, else UTC);
    /// absent without a schedule or while it is suspended.
    pub next_run: Option<String>,
    /// `status.progress`: the phase and percent of the baseline being written (`Copying 42%`).
    pub progress: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SourceLine {
    pub namespace: String,
    pub name: String,
    pub ready: String,
    pub reason: Option<String>,
    pub engines_ready: Option<i32>,
    pub engines: Option<i32>,
    pub position: Option<String>,
    pub head: Option<String>,
    /// Whether the engines applied the archive's head (`CaughtUp`).
    pub caught_up: Option<bool>,
    /// When the head was written: the age of the data served.
    pub head_time: Option<String>,
    pub rebaselines: Option<i64>,
    pub rows: Option<i64>,
    /// Distance behind the head (`status.lag.summary`): `0` when caught up.
    pub lag: Option<String>,
    /// `status.progress` of the engines' baseline load (`Loading 42%`).
    pub progress: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SourceSetLine {
    pub name: String,
    pub ready: String,
    pub desired_namespaces: Option<i32>,
    pub ready_namespaces: Option<i32>,
    /// `namespace: reason`.
    pub failing: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct WarningLine {
    pub namespace: String,
    /// `Kind/name`.
    pub object: String,
    pub reason: String,
    pub message: String,
    pub last_seen: Option<String>,
    pub count: i32,
}

const KINDS: [&str; 3] = ["ArchiveExport", "ArchiveSource", "ArchiveSourceSet"];

pub async fn run(args: StatusArgs) -> anyhow::Result<i32> {
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let overview = read(&client, args.namespace.as_deref(), args.events).await?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&overview)?);
    } else {
        print!("{}", render(&overview));
    }
    Ok(0)
}

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn condition(conditions: &[Condition], kind: &str) -> Option<Condition> {
    conditions.iter().find(|c| c.type_ == kind).cloned()
}

fn ready_of(conditions: &[Condition]) -> (String, Option<String>) {
    match condition(conditions, "Ready") {
        Some(c) if c.status == ConditionStatus::True => ("True".into(), None),
        Some(c) => (c.status.as_str().into(), Some(c.reason)),
        None => ("Unknown".into(), None),
    }
}

/// A failed list, saying what to do when the kind is unknown to the cluster.
fn listing(what: &str, e: kube::Error) -> anyhow::Error {
    match &e {
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
            "listing {what}: the cluster does not know the kind: install larch's CRDs (`larch crd | kubectl apply --server-side -f -`)"
        ),
        _ => anyhow::Error::from(e).context(format!("listing {what}")),
    }
}

/// Reads the three kinds and the warning Events about them.
pub async fn read(
    client: &kube::Client,
    namespace: Option<&str>,
    events: usize,
) -> anyhow::Result<Overview> {
    let lp = ListParams::default();
    let exports = api::<ArchiveExport>(client, namespace)
        .list(&lp)
        .await
        .map_err(|e| listing("ArchiveExports", e))?;
    let sources = api::<ArchiveSource>(client, namespace)
        .list(&lp)
        .await
        .map_err(|e| listing("ArchiveSources", e))?;
    let sets = Api::<ArchiveSourceSet>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| listing("ArchiveSourceSets", e))?;
    let warnings = api::<Event>(client, namespace)
        .list(&ListParams::default().fields("type=Warning"))
        .await
        .map_err(|e| listing("Events", e))?;
    Ok(Overview {
        exports: exports.items.iter().map(export_line).collect(),
        sources: sources.items.iter().map(source_line).collect(),
        source_sets: sets.items.iter().map(source_set_line).collect(),
        warnings: warning_lines(warnings.items, events),
    })
}

/// One export's line: its Ready condition, last export (else first writer) and schedule.
fn export_line(e: &ArchiveExport) -> ExportLine {
    let status = e.status.clone().unwrap_or_default();
    let (ready, reason) = ready_of(&status.conditions);
    let last = status.last_export.clone();
    let run = status.run.as_ref().map(|r| {
        match r.succeeded {
            Some(true) => "succeeded",
            Some(false) => "failed",
            None => "running",
        }
        .to_string()
    });
    ExportLine {
        namespace: e.metadata.namespace.clone().unwrap_or_default(),
        name: e.metadata.name.clone().unwrap_or_default(),
        mode: format!("{:?}", e.spec.mode),
        ready,
        reason,
        last_export: last.as_ref().and_then(|l| l.time.clone()),
        position: last
            .as_ref()
            .and_then(|l| l.position.clone())
            .or_else(|| status.writers.first().and_then(|w| w.head_position.clone())),
        epoch: last
            .as_ref()
            .and_then(|l| l.epoch)
            .or_else(|| status.writers.first().and_then(|w| w.epoch)),
        rows: last.as_ref().and_then(|l| l.row_count),
        schedule: e.spec.schedule.as_ref().map(|s| {
            if s.suspend == Some(true) {
                format!("{} (suspended)", s.cron)
            } else {
                s.cron.clone()
            }
        }),
        run,
        next_run: next_run(e, jiff::Timestamp::now()),
        progress: status.progress.as_ref().map(progress_text),
    }
}

fn source_line(s: &ArchiveSource) -> SourceLine {
    let status = s.status.clone().unwrap_or_default();
    let (ready, reason) = ready_of(&status.conditions);
    SourceLine {
        namespace: s.metadata.namespace.clone().unwrap_or_default(),
        name: s.metadata.name.clone().unwrap_or_default(),
        ready,
        reason,
        engines_ready: status.ready_replicas,
        engines: s.spec.replicas,
        position: status.position.clone(),
        head: status.head.clone(),
        caught_up: condition(&status.conditions, "CaughtUp")
            .map(|c| c.status == ConditionStatus::True),
        head_time: status.head_time.clone(),
        rebaselines: status.rebaselines.as_ref().map(|r| r.total),
        rows: status.rows,
        lag: status.lag.as_ref().map(|l| l.summary.clone()),
        progress: status.progress.as_ref().map(progress_text),
    }
}

fn source_set_line(set: &ArchiveSourceSet) -> SourceSetLine {
    let status = set.status.clone().unwrap_or_default();
    SourceSetLine {
        name: set.metadata.name.clone().unwrap_or_default(),
        ready: ready_of(&status.conditions).0,
        desired_namespaces: status.desired_namespaces,
        ready_namespaces: status.ready_namespaces,
        failing: status
            .failing_namespaces
            .iter()
            .map(|f| format!("{}: {}", f.namespace, f.reason))
            .collect(),
    }
}

/// The newest `events` warning Events about the three kinds, newest first.
fn warning_lines(warnings: Vec<Event>, events: usize) -> Vec<WarningLine> {
    let mut ours: Vec<Event> = warnings
        .into_iter()
        .filter(|e| {
            e.involved_object
                .kind
                .as_deref()
                .is_some_and(|k| KINDS.contains(&k))
        })
        .collect();
    let seen = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
            .or_else(|| {
                e.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
            })
    };
    ours.sort_by_key(|e| std::cmp::Reverse(seen(e)));
    ours.into_iter()
        .take(events)
        .map(|e| WarningLine {
            namespace: e.metadata.namespace.clone().unwrap_or_default(),
            object: format!(
                "{}/{}",
                e.involved_object.kind.clone().unwrap_or_default(),
                e.involved_object.name.clone().unwrap_or_default()
            ),
            reason: e.reason.clone().unwrap_or_default(),
            message: e.message.clone().unwrap_or_default(),
            last_seen: seen(&e),
            count: e.count.unwrap_or(1),
        })
        .collect()
}

/// When a scheduled, unsuspended export runs next after `now` (its cron in its time zone);
/// `None` for one the operator would refuse too.
fn next_run(e: &ArchiveExport, now: jiff::Timestamp) -> Option<String> {
    let s = e.spec.schedule.as_ref()?;
    if s.suspend == Some(true) || e.spec.suspend == Some(true) {
        return None;
    }
    let next = crate::operator::cron::next_after(&s.cron, s.time_zone.as_deref(), now).ok()??;
    Some(next.to_string())
}

/// `Copying 42%`, `Complete 100%`, or the phase and rows without an expected total.
fn progress_text(p: &OperationProgress) -> String {
    match &p.percent {
        Some(pct) => format!("{} {pct}", p.phase),
        None => format!("{} {} rows", p.phase, p.rows),
    }
}

/// Columns padded to their widest cell.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<String>| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(&mut out, header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(&mut out, r);
    }
    out
}

fn or_dash<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("-".into(), |v| v.to_string())
}

/// The one screen.
pub fn render(o: &Overview) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "ARCHIVE EXPORTS");
    out.push_str(&exports_table(&o.exports));
    let _ = writeln!(out, "\nARCHIVE SOURCES");
    out.push_str(&sources_table(&o.sources));
    let _ = writeln!(out, "\nARCHIVE SOURCE SETS");
    out.push_str(&source_sets_table(&o.source_sets));
    let _ = writeln!(out, "\nRECENT WARNINGS");
    out.push_str(&warnings_table(&o.warnings));
    out
}

fn exports_table(exports: &[ExportLine]) -> String {
    table(
        &[
            "NAMESPACE",
            "NAME",
            "MODE",
            "READY",
            "LAST EXPORT",
            "RUN",
            "POSITION",
            "EPOCH",
            "ROWS",
            "PROGRESS",
            "SCHEDULE",
            "NEXT RUN",
        ],
        exports
            .iter()
            .map(|e| {
                vec![
                    e.namespace.clone(),
                    e.name.clone(),
                    e.mode.clone(),
                    ready_text(&e.ready, &e.reason),
                    or_dash(&e.last_export),
                    or_dash(&e.run),
                    or_dash(&e.position),
                    or_dash(&e.epoch),
                    or_dash(&e.rows),
                    or_dash(&e.progress),
                    or_dash(&e.schedule),
                    or_dash(&e.next_run),
                ]
            })
            .collect(),
    )
}

fn sources_table(sources: &[SourceLine]) -> String {
    table(
        &[
            "NAMESPACE",
            "NAME",
            "READY",
            "ENGINES",
            "CAUGHT UP",
            "LAG",
            "POSITION",
            "HEAD",
            "HEAD WRITTEN",
            "PROGRESS",
            "REBASELINES",
            "ROWS",
        ],
        sources
            .iter()
            .map(|s| {
                vec![
                    s.namespace.clone(),
                    s.name.clone(),
                    ready_text(&s.ready, &s.reason),
                    format!(
                        "{}/{}",
                        s.engines_ready.unwrap_or(0),
                        or_dash(&s.engines.or(Some(1)))
                    ),
                    or_dash(&s.caught_up),
                    or_dash(&s.lag),
                    or_dash(&s.position),
                    or_dash(&s.head),
                    or_dash(&s.head_time),
                    or_dash(&s.progress),
                    or_dash(&s.rebaselines),
                    or_dash(&s.rows),
                ]
            })
            .collect(),
    )
}

fn source_sets_table(sets: &[SourceSetLine]) -> String {
    table(
        &["NAME", "READY", "NAMESPACES READY", "FAILING"],
        sets.iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.ready.clone(),
                    format!(
                        "{}/{}",
                        or_dash(&s.ready_namespaces),
                        or_dash(&s.desired_namespaces)
                    ),
                    if s.failing.is_empty() {
                        "-".into()
                    } else {
                        s.failing.join(", ")
                    },
                ]
            })
            .collect(),
    )
}

fn warnings_table(warnings: &[WarningLine]) -> String {
    table(
        &[
            "LAST SEEN",
            "NAMESPACE",
            "OBJECT",
            "REASON",
            "COUNT",
            "MESSAGE",
        ],
        warnings
            .iter()
            .map(|w| {
                vec![
                    or_dash(&w.last_seen),
                    w.namespace.clone(),
                    w.object.clone(),
                    w.reason.clone(),
                    w.count.to_string(),
                    w.message.chars().take(100).collect(),
                ]
            })
            .collect(),
    )
}

/// `True`, or the status with why it is not Ready.
fn ready_text(r: &str, why: &Option<String>) -> String {
    match why {
        Some(w) => format!("{r} ({w})"),
        None => r.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_run_of_a_scheduled_export_in_its_time_zone() {
        let now: jiff::Timestamp = "2027-01-14T10:17:30Z".parse().unwrap();
        let mut e: crate::operator::crd::ArchiveExport = serde_yaml_ng::from_str(include_str!(
            "../../crates/operator/src/builders/testdata/export-oneshot-s3.input.yaml"
        ))
        .unwrap();
        e.spec.schedule = None;
        assert_eq!(next_run(&e, now), None, "no schedule");
        e.spec.schedule = Some(
            serde_json::from_value(
                serde_json::json!({"cron": "30 2 * * *", "timeZone": "Asia/Tokyo"}),
            )
            .unwrap(),
        );
        // 02:30 in Tokyo (UTC+9) is 17:30 UTC the day before.
        assert_eq!(next_run(&e, now).as_deref(), Some("2027-01-14T17:30:00Z"));
        e.spec.schedule.as_mut().unwrap().suspend = Some(true);
        assert_eq!(next_run(&e, now), None, "suspended");
    }

    #[test]
    fn one_screen_pads_columns_and_says_why_not_ready() {
        let o = Overview {
            exports: vec![ExportLine {
                namespace: "db".into(),
                name: "orders".into(),
                mode: "OneShot".into(),
                ready: "False".into(),
                reason: Some("TableNotFound".into()),
                last_export: None,
                position: Some("0/16B3748".into()),
                epoch: Some(3),
                rows: Some(200_000),
                schedule: Some("@daily".into()),
                run: Some("failed".into()),
                next_run: Some("2027-01-16T00:00:00Z".into()),
                progress: Some("Failed 60%".into()),
            }],
            source_sets: vec![SourceSetLine {
                name: "seed".into(),
                ready: "False".into(),
                desired_namespaces: Some(3),
                ready_namespaces: Some(2),
                failing: vec!["dev-c: QuotaExceeded".into()],
            }],
            ..Default::default()
        };
        let text = render(&o);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ARCHIVE EXPORTS");
        assert!(
            lines[1].starts_with("NAMESPACE  NAME    MODE     READY"),
            "{text}"
        );
        assert!(
            lines[2].contains("db         orders  OneShot  False (TableNotFound)"),
            "{text}"
        );
        assert!(
            lines[2].contains("200000  Failed 60%  @daily    2027-01-16T00:00:00Z"),
            "{text}"
        );
        assert!(lines[1].ends_with("SCHEDULE  NEXT RUN"), "{text}");
        assert!(
            text.contains("seed  False  2/3               dev-c: QuotaExceeded"),
            "{text}"
        );
    }
}
