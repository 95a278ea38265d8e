//! `larch status KIND/NAME`: one object, as `cnpg status CLUSTER` shows one cluster: its line
//! of the overview, its conditions, its progress and its recent Events (every type).

use std::fmt::Write as _;

use anyhow::Context;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde::Serialize;
use serde_json::Value;

use super::lines::{event_seen, export_line, restore_line, source_line, source_set_line};
use super::render::{or_dash, table};
use super::{forbidden, listing};
use crate::operator::crd::common::Condition;
use crate::operator::crd::progress::OperationProgress;
use crate::operator::crd::{ArchiveExport, ArchiveRestore, ArchiveSource, ArchiveSourceSet};

#[derive(Debug, Serialize)]
pub struct ObjectView {
    pub kind: String,
    /// Absent for an ArchiveSourceSet (cluster-scoped).
    pub namespace: Option<String>,
    pub name: String,
    /// The object's line of the overview (`larch status -o json`).
    pub summary: Value,
    pub conditions: Vec<ConditionLine>,
    pub progress: Option<OperationProgress>,
    /// Its Events, newest first.
    pub events: Vec<EventLine>,
    /// What could not be read (not allowed).
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ConditionLine {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition: String,
}

#[derive(Debug, Serialize)]
pub struct EventLine {
    pub last_seen: Option<String>,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub count: i32,
    pub message: String,
}

/// The kind named in `KIND/NAME`: its name, plural or short name, any case.
pub(super) fn kind_of(object: &str) -> anyhow::Result<(&'static str, &str)> {
    let (kind, name) = object
        .split_once('/')
        .filter(|(k, n)| !k.is_empty() && !n.is_empty())
        .with_context(|| format!("`{object}`: expected KIND/NAME, e.g. archiveexport/users"))?;
    let lower = kind.to_ascii_lowercase();
    let kind = match lower.strip_suffix(".larch.dev").unwrap_or(&lower) {
        "archiveexport" | "archiveexports" | "aexp" => "ArchiveExport",
        "archivesource" | "archivesources" | "asrc" => "ArchiveSource",
        "archiverestore" | "archiverestores" | "arst" => "ArchiveRestore",
        "archivesourceset" | "archivesourcesets" | "asrcset" => "ArchiveSourceSet",
        _ => anyhow::bail!(
            "`{object}`: unknown kind `{kind}` (archiveexport, archivesource, archiverestore or archivesourceset)"
        ),
    };
    Ok((kind, name))
}

/// Prints one object; `namespace` is `-n`'s, else the kubeconfig's.
pub async fn run(
    client: &kube::Client,
    namespace: &str,
    (kind, name): (&'static str, &str),
    output: crate::cli::output::Output,
    events: usize,
) -> anyhow::Result<i32> {
    let mut view = match kind {
        "ArchiveExport" => {
            let o = get(
                Api::<ArchiveExport>::namespaced(client.clone(), namespace),
                kind,
                name,
            )
            .await?;
            view_of(&o, serde_json::to_value(export_line(&o))?)?
        }
        "ArchiveSource" => {
            let o = get(
                Api::<ArchiveSource>::namespaced(client.clone(), namespace),
                kind,
                name,
            )
            .await?;
            view_of(&o, serde_json::to_value(source_line(&o))?)?
        }
        "ArchiveRestore" => {
            let o = get(
                Api::<ArchiveRestore>::namespaced(client.clone(), namespace),
                kind,
                name,
            )
            .await?;
            view_of(&o, serde_json::to_value(restore_line(&o))?)?
        }
        _ => {
            let o = get(Api::<ArchiveSourceSet>::all(client.clone()), kind, name).await?;
            view_of(&o, serde_json::to_value(source_set_line(&o))?)?
        }
    };
    view.kind = kind.to_string();
    read_events(client, &mut view, events).await?;
    crate::cli::output::print(&view, output, || render_object(&view))?;
    Ok(0)
}

async fn get<K>(api: Api<K>, kind: &str, name: &str) -> anyhow::Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get(name).await {
        Ok(o) => Ok(o),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(super::bad_input(anyhow::anyhow!(
            "{kind} {name} not found: {}",
            s.message
        ))),
        Err(e) => Err(anyhow::Error::from(e).context(format!("reading {kind} {name}"))),
    }
}

/// The conditions and progress of any of the four kinds, read from its status.
fn view_of<K: kube::Resource + Serialize>(o: &K, summary: Value) -> anyhow::Result<ObjectView> {
    let status = serde_json::to_value(o)?["status"].take();
    let conditions: Vec<Condition> =
        serde_json::from_value(status["conditions"].clone()).unwrap_or_default();
    let progress = serde_json::from_value(status["progress"].clone()).ok();
    Ok(ObjectView {
        kind: String::new(),
        namespace: o.meta().namespace.clone(),
        name: o.meta().name.clone().unwrap_or_default(),
        summary,
        conditions: conditions
            .into_iter()
            .map(|c| ConditionLine {
                type_: c.type_,
                status: c.status.as_str().to_string(),
                reason: c.reason,
                message: c.message,
                last_transition: c.last_transition_time,
            })
            .collect(),
        progress,
        events: Vec::new(),
        notes: Vec::new(),
    })
}

/// The newest `events` Events about the object (those of a cluster-scoped one are in any
/// namespace); a refused list is a note.
async fn read_events(
    client: &kube::Client,
    view: &mut ObjectView,
    events: usize,
) -> anyhow::Result<()> {
    let api = match &view.namespace {
        Some(ns) => Api::<Event>::namespaced(client.clone(), ns),
        None => Api::<Event>::all(client.clone()),
    };
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind={},involvedObject.name={}",
        view.kind, view.name
    ));
    let mut list = match api.list(&lp).await {
        Ok(l) => l.items,
        Err(e) if forbidden(&e) => {
            view.notes.push("Events: not allowed to list".to_string());
            return Ok(());
        }
        Err(e) => return Err(listing("Events", e)),
    };
    list.sort_by_key(|e| std::cmp::Reverse(event_seen(e)));
    view.events = list
        .iter()
        .take(events)
        .map(|e| EventLine {
            last_seen: event_seen(e),
            type_: e.type_.clone().unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            count: e.count.unwrap_or(1),
            message: e.message.clone().unwrap_or_default(),
        })
        .collect();
    Ok(())
}

/// A summary value as one cell: text as is, lists joined.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// The object's screen: summary fields, conditions, progress, Events.
pub fn render_object(v: &ObjectView) -> String {
    let mut out = String::new();
    let at = v
        .namespace
        .as_ref()
        .map(|ns| format!("{ns}/"))
        .unwrap_or_default();
    let _ = writeln!(out, "{} {at}{}", v.kind, v.name);
    if let Value::Object(fields) = &v.summary {
        for (key, value) in fields {
            let empty = value.is_null() || value.as_array().is_some_and(|a| a.is_empty());
            if key != "namespace" && key != "name" && !empty {
                let _ = writeln!(out, "  {}: {}", key.replace('_', " "), cell(value));
            }
        }
    }
    let _ = writeln!(out, "\nCONDITIONS");
    out.push_str(&table(
        &["TYPE", "STATUS", "REASON", "LAST TRANSITION", "MESSAGE"],
        v.conditions
            .iter()
            .map(|c| {
                let message = c.message.chars().take(120).collect();
                vec![
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.last_transition.clone(),
                    message,
                ]
            })
            .collect(),
    ));
    let _ = writeln!(out, "\nPROGRESS");
    let _ = writeln!(out, "{}", progress_line(&v.progress));
    let _ = writeln!(out, "\nEVENTS");
    out.push_str(&table(
        &["LAST SEEN", "TYPE", "REASON", "COUNT", "MESSAGE"],
        v.events
            .iter()
            .map(|e| {
                let message = e.message.chars().take(120).collect();
                vec![
                    or_dash(&e.last_seen),
                    e.type_.clone(),
                    e.reason.clone(),
                    e.count.to_string(),
                    message,
                ]
            })
            .collect(),
    ));
    if !v.notes.is_empty() {
        let _ = writeln!(out, "\nNOTES");
        for n in &v.notes {
            let _ = writeln!(out, "{n}");
        }
    }
    out
}

/// `Copying 42%: 420 of 1000 rows, 100 rows/s, 6s left`, or `-`.
fn progress_line(p: &Option<OperationProgress>) -> String {
    let Some(p) = p else { return "-".into() };
    let mut text = p.phase.clone();
    if let Some(pct) = &p.percent {
        let _ = write!(text, " {pct}");
    }
    let _ = write!(text, ": {}", p.rows);
    if let Some(total) = p.expected_rows {
        let _ = write!(text, " of {total}");
    }
    text.push_str(" rows");
    if let Some(rate) = p.rows_per_second {
        let _ = write!(text, ", {rate} rows/s");
    }
    if let Some(eta) = p.eta_seconds {
        let _ = write!(text, ", {eta}s left");
    }
    if let Some(at) = &p.updated_time {
        let _ = write!(text, " (at {at})");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_name_plural_or_short_name() {
        assert_eq!(
            kind_of("archiveexport/users").unwrap(),
            ("ArchiveExport", "users")
        );
        assert_eq!(kind_of("ArchiveSources/c").unwrap(), ("ArchiveSource", "c"));
        assert_eq!(kind_of("arst/back").unwrap(), ("ArchiveRestore", "back"));
        assert_eq!(
            kind_of("archivesourceset.larch.dev/seed").unwrap(),
            ("ArchiveSourceSet", "seed")
        );
        let e = kind_of("deployment/x").unwrap_err().to_string();
        assert!(e.contains("unknown kind `deployment`"), "{e}");
        let e = kind_of("users").unwrap_err().to_string();
        assert!(e.contains("expected KIND/NAME"), "{e}");
    }

    #[test]
    fn one_object_with_its_conditions_progress_and_events() {
        let export: ArchiveExport = serde_json::from_value(serde_json::json!({
            "apiVersion": "larch.dev/v1alpha1",
            "kind": "ArchiveExport",
            "metadata": {"name": "users", "namespace": "data"},
            "spec": serde_saphyr::from_str::<Value>(include_str!(
                "../../../crates/operator/src/builders/testdata/export-oneshot-s3.input.yaml"
            )).unwrap()["spec"],
            "status": {
                "conditions": [{
                    "type": "Ready", "status": "False", "reason": "Exporting",
                    "message": "copying public.users", "lastTransitionTime": "2027-01-14T10:00:00Z"
                }],
                "progress": {"phase": "Copying", "rows": 420, "expectedRows": 1000,
                             "rowsPerSecond": 100, "etaSeconds": 6, "percent": "42%", "pods": 1}
            }
        }))
        .unwrap();
        let mut view =
            view_of(&export, serde_json::to_value(export_line(&export)).unwrap()).unwrap();
        view.kind = "ArchiveExport".into();
        view.events.push(EventLine {
            last_seen: Some("2027-01-14T10:00:01Z".into()),
            type_: "Normal".into(),
            reason: "ExportStarted".into(),
            count: 1,
            message: "run abc".into(),
        });
        let text = render_object(&view);
        assert!(text.starts_with("ArchiveExport data/users\n"), "{text}");
        assert!(text.contains("\n  mode: OneShot\n"), "{text}");
        assert!(text.contains("\n  ready: False\n"), "{text}");
        assert!(
            text.contains("Ready  False   Exporting  2027-01-14T10:00:00Z  copying public.users"),
            "{text}"
        );
        assert!(
            text.contains("\nPROGRESS\nCopying 42%: 420 of 1000 rows, 100 rows/s, 6s left\n"),
            "{text}"
        );
        assert!(
            text.contains("2027-01-14T10:00:01Z  Normal  ExportStarted  1      run abc"),
            "{text}"
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["conditions"][0]["reason"], "Exporting", "{json}");
        assert_eq!(json["progress"]["rows"], 420, "{json}");
        assert_eq!(json["summary"]["progress"], "Copying 42%", "{json}");
    }
}
