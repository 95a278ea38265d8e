//! The engine's state in laredo's messages: rows as `Struct`s, pipelines, sources, columns.

use std::sync::Arc;

use pbjson_types::{Struct, Timestamp};
use serde_json::Value;
use tonic::Status;

use larch_laredo_api::v1 as pb;

use super::super::Shared;
use super::super::metrics::PipelineState;
use super::super::pipeline::{Pipeline, SourceRunner};
use super::super::targets::Target;
use larch_archive::model::ColumnDefinition;
use larch_archive::source::ChangeEvent;

pub fn now() -> Timestamp {
    timestamp(chrono::Utc::now())
}

pub fn timestamp(t: chrono::DateTime<chrono::Utc>) -> Timestamp {
    Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// A row's JSON text as a `Struct` (numbers become doubles, as laredo's rows do).
pub fn row(text: &str) -> Result<Struct, Status> {
    serde_json::from_str(text)
        .map_err(|e| Status::internal(format!("a stored row is not a JSON object: {e}")))
}

/// A JSON object as a `Struct` (anything else: empty).
pub fn details(v: &Value) -> Option<Struct> {
    serde_json::from_value(v.clone()).ok()
}

/// A `Value` as the text the tables API takes in its query strings.
pub fn key_text(v: &pbjson_types::Value) -> String {
    use pbjson_types::value::Kind;
    match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15 => {
            format!("{}", *n as i64)
        }
        Some(Kind::NumberValue(n)) => n.to_string(),
        Some(Kind::BoolValue(b)) => b.to_string(),
        Some(Kind::NullValue(_)) | None => "null".into(),
        Some(other) => serde_json::to_string(other).unwrap_or_default(),
    }
}

pub fn subscribe_response(c: &ChangeEvent) -> Result<pb::SubscribeResponse, Status> {
    Ok(pb::SubscribeResponse {
        action: c.action.as_str().into(),
        position: c.position.clone(),
        xid: 0,
        timestamp: Some(c.commit_time.map_or_else(now, timestamp)),
        old_values: c.old.as_ref().map(|r| row(r.as_str())).transpose()?,
        new_values: c.new.as_ref().map(|r| row(r.as_str())).transpose()?,
    })
}

pub fn pipeline_state(s: PipelineState) -> pb::PipelineState {
    match s {
        PipelineState::Initializing => pb::PipelineState::Initializing,
        PipelineState::Baselining => pb::PipelineState::Baselining,
        PipelineState::Streaming => pb::PipelineState::Streaming,
        PipelineState::Paused => pb::PipelineState::Paused,
        PipelineState::Error => pb::PipelineState::Error,
        PipelineState::Stopped => pb::PipelineState::Stopped,
    }
}

/// The engine's state as laredo sums it up: an error anywhere, else paused anywhere, else
/// streaming once ready, baselining before.
pub fn service_state(shared: &Shared) -> pb::ServiceState {
    let states: Vec<PipelineState> = shared
        .runners
        .iter()
        .flat_map(|r| r.pipelines.iter().map(|p| p.state()))
        .collect();
    if states.contains(&PipelineState::Error) {
        pb::ServiceState::Error
    } else if states.contains(&PipelineState::Paused) {
        pb::ServiceState::Paused
    } else if shared.ready() {
        pb::ServiceState::Streaming
    } else {
        pb::ServiceState::Baselining
    }
}

/// A runner's source and pipeline entries of `/status`, read once.
pub struct Snapshot {
    pub source: Value,
    pub pipelines: Vec<(String, Value)>,
}

pub fn snapshot(r: &SourceRunner) -> Snapshot {
    let (source, pipelines) = r.status();
    Snapshot { source, pipelines }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

pub fn pipeline_status(r: &SourceRunner, p: &Pipeline, snap: &Snapshot) -> pb::PipelineStatus {
    let entry = snap.pipelines.iter().find(|(id, _)| *id == p.id);
    let row_count = entry
        .and_then(|(_, v)| v.get("row_count"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let error = (p.state() == PipelineState::Error)
        .then(|| {
            snap.source
                .pointer("/last_error/message")
                .and_then(Value::as_str)
        })
        .flatten()
        .unwrap_or("");
    pb::PipelineStatus {
        pipeline_id: p.id.clone(),
        source_id: r.id.clone(),
        schema: r.table.schema.clone(),
        table: r.table.table.clone(),
        target_type: p.target.kind().into(),
        state: pipeline_state(p.state()) as i32,
        row_count,
        error_message: error.into(),
        ..Default::default()
    }
}

pub fn pipelines_of(r: &SourceRunner) -> Vec<pb::PipelineStatus> {
    let snap = snapshot(r);
    r.pipelines
        .iter()
        .map(|p| pipeline_status(r, p, &snap))
        .collect()
}

pub fn source_info(r: &SourceRunner) -> pb::SourceInfo {
    let s = snapshot(r).source;
    let lag = s.get("lag_seconds").and_then(Value::as_f64);
    pb::SourceInfo {
        source_id: r.id.clone(),
        source_type: "archive".into(),
        // A durable target resumes from its checkpoint; a memory table reloads the archive.
        supports_resume: true,
        ordering_guarantee: "total".into(),
        current_position: text(&s, "position"),
        acked_position: text(&s, "acked"),
        lag_bytes: s
            .pointer("/behind/bytes")
            .and_then(Value::as_i64)
            .unwrap_or(0),
        lag_time: lag.map(|secs| pbjson_types::Duration {
            seconds: secs.trunc() as i64,
            nanos: (secs.fract() * 1e9) as i32,
        }),
        details: details(&s),
    }
}

pub fn source_status(r: &SourceRunner) -> pb::SourceStatus {
    let i = source_info(r);
    pb::SourceStatus {
        source_id: i.source_id,
        source_type: i.source_type,
        supports_resume: i.supports_resume,
        ordering_guarantee: i.ordering_guarantee,
        current_position: i.current_position,
        acked_position: i.acked_position,
        lag_bytes: i.lag_bytes,
        lag_time: i.lag_time,
        source_details: i.details,
    }
}

/// A memory table's indexes: one equality index per index field (larch names an index by
/// its field), and the primary key.
pub fn indexes(t: &super::MemoryTarget) -> Vec<pb::IndexInfo> {
    let key = t.key_fields();
    let mut out = vec![pb::IndexInfo {
        name: "primary".into(),
        fields: key.to_vec(),
        unique: true,
        entry_count: t.len() as i64,
    }];
    for (field, entries) in Target::index_fields(t).iter().zip(t.index_entries()) {
        out.push(pb::IndexInfo {
            name: field.clone(),
            fields: vec![field.clone()],
            unique: false,
            entry_count: entries as i64,
        });
    }
    out
}

pub fn column(c: &ColumnDefinition) -> pb::ColumnDefinition {
    pb::ColumnDefinition {
        ordinal_position: c.ordinal_position as i32,
        column_name: c.name.clone(),
        data_type: if c.sql_type.is_empty() {
            c.type_name.clone()
        } else {
            c.sql_type.clone()
        },
        not_null: !c.nullable,
        is_primary_key: c.primary_key,
        primary_key_ordinal: c.primary_key_ordinal as i32,
    }
}

pub fn runner<'a>(shared: &'a Shared, id: &str) -> Result<&'a Arc<SourceRunner>, Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("source_id is required"));
    }
    shared.runner(id).ok_or_else(|| {
        Status::not_found(format!(
            "no source {id:?} (sources: {})",
            shared
                .runners
                .iter()
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}
