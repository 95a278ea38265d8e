//! `laredo.v1.LaredoOAMService`: status, readiness, sources, tables, pause and resume. What
//! larch has no counterpart for answers UNIMPLEMENTED with the larch way ([`unimplemented`]).

use tonic::{Request, Response, Status};

use larch_laredo_api::v1 as pb;
use larch_laredo_api::v1::laredo_oam_service_server::LaredoOamService;

use super::{Api, Group, status, watch};

/// Why an RPC of laredo's has no counterpart in larch, and what to use instead.
pub fn unimplemented_reason(rpc: &str) -> Option<&'static str> {
    Some(match rpc {
        "ResetSource" => {
            "larch's engine reads archives, not replication slots: drop an export's slot with `larch export cleanup` and re-export with `larch export`"
        }
        "DrainReplication" => "larch's engine has no replication fan-out to drain",
        "CreateSnapshot" | "ListSnapshots" | "InspectSnapshot" | "RestoreSnapshot"
        | "DeleteSnapshot" | "PruneSnapshots" => {
            "larch's engine keeps no snapshots of its own: the archive is the snapshot (`larch export` writes it, `larch archive inspect|verify|gc` manage it, `larch restore` loads one into PostgreSQL)"
        }
        "ListDeadLetters" | "ReplayDeadLetters" | "PurgeDeadLetters" => {
            "larch's engine has no dead letters: a change that fails marks its pipeline ERROR and is retried (see GetStatus, /status)"
        }
        "StartReplay" | "GetReplayStatus" | "StopReplay" => {
            "larch replays an archive into a separate engine: run `larch engine` with the source's `at` set to the point to replay to"
        }
        _ => return None,
    })
}

pub fn unimplemented(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc}: {}",
        unimplemented_reason(rpc).unwrap_or("not served by larch")
    ))
}

#[tonic::async_trait]
impl LaredoOamService for Api {
    async fn get_status(
        &self,
        request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        self.allow(&request, Group::Status)?;
        let s = &self.shared;
        Ok(Response::new(pb::GetStatusResponse {
            state: status::service_state(s) as i32,
            sources: s.runners.iter().map(|r| status::source_status(r)).collect(),
            pipelines: s
                .runners
                .iter()
                .flat_map(|r| status::pipelines_of(r))
                .collect(),
            started_at: Some(self.started_at),
            last_change_at: None,
            snapshot_status: Some(pb::SnapshotSummary::default()),
        }))
    }

    async fn get_table_status(
        &self,
        request: Request<pb::GetTableStatusRequest>,
    ) -> Result<Response<pb::GetTableStatusResponse>, Status> {
        self.allow(&request, Group::Status)?;
        let r = request.into_inner();
        if r.schema.is_empty() || r.table.is_empty() {
            return Err(Status::invalid_argument("schema and table are required"));
        }
        let runners: Vec<_> = self
            .shared
            .runners
            .iter()
            .filter(|x| x.table.schema == r.schema && x.table.table == r.table)
            .collect();
        if runners.is_empty() {
            return Err(Status::not_found(format!(
                "no table {}.{} in this engine",
                r.schema, r.table
            )));
        }
        let indexes = self
            .memory_table(&r.schema, &r.table)
            .map(|t| status::indexes(&t))
            .unwrap_or_default();
        Ok(Response::new(pb::GetTableStatusResponse {
            pipelines: runners
                .iter()
                .flat_map(|x| status::pipelines_of(x))
                .collect(),
            indexes,
        }))
    }

    async fn get_pipeline_status(
        &self,
        request: Request<pb::GetPipelineStatusRequest>,
    ) -> Result<Response<pb::GetPipelineStatusResponse>, Status> {
        self.allow(&request, Group::Status)?;
        let id = request.into_inner().pipeline_id;
        if id.is_empty() {
            return Err(Status::invalid_argument("pipeline_id is required"));
        }
        for r in &self.shared.runners {
            if let Some(p) = r.pipelines.iter().find(|p| p.id == id) {
                let snap = status::snapshot(r);
                let indexes = match p.target.kind() {
                    "memory" => self
                        .memory_table(&r.table.schema, &r.table.table)
                        .map(|t| status::indexes(&t))
                        .unwrap_or_default(),
                    _ => Vec::new(),
                };
                return Ok(Response::new(pb::GetPipelineStatusResponse {
                    status: Some(status::pipeline_status(r, p, &snap)),
                    indexes,
                }));
            }
        }
        Err(Status::not_found(format!("pipeline {id} not found")))
    }

    type WatchStatusStream = watch::Events;

    async fn watch_status(
        &self,
        request: Request<pb::WatchStatusRequest>,
    ) -> Result<Response<watch::Events>, Status> {
        self.allow(&request, Group::Status)?;
        Ok(Response::new(watch::start(self, request.into_inner())))
    }

    async fn check_ready(
        &self,
        request: Request<pb::CheckReadyRequest>,
    ) -> Result<Response<pb::CheckReadyResponse>, Status> {
        self.allow(&request, Group::Open)?;
        let r = request.into_inner();
        let shared = &self.shared;
        let (ready, reason) = if !r.source.is_empty() {
            let ready = status::runner(shared, &r.source)?.ready();
            (ready, format!("source {} is not ready", r.source))
        } else if !r.table.is_empty() {
            let of_table: Vec<_> = shared
                .runners
                .iter()
                .filter(|x| x.table.to_string() == r.table || x.table.table == r.table)
                .collect();
            if of_table.is_empty() {
                return Err(Status::not_found(format!("no table {}", r.table)));
            }
            let ready = of_table.iter().all(|x| x.ready());
            (ready, format!("table {} is not ready", r.table))
        } else if !r.pipeline_id.is_empty() {
            let Some(x) = shared
                .runners
                .iter()
                .find(|x| x.pipelines.iter().any(|p| p.id == r.pipeline_id))
            else {
                return Err(Status::not_found(format!(
                    "pipeline {} not found",
                    r.pipeline_id
                )));
            };
            (
                x.ready(),
                format!("pipeline {} is not ready", r.pipeline_id),
            )
        } else {
            (shared.ready(), "not all pipelines are ready".to_string())
        };
        Ok(Response::new(pb::CheckReadyResponse {
            ready,
            not_ready_reasons: if ready { Vec::new() } else { vec![reason] },
        }))
    }

    async fn get_source_info(
        &self,
        request: Request<pb::GetSourceInfoRequest>,
    ) -> Result<Response<pb::GetSourceInfoResponse>, Status> {
        self.allow(&request, Group::Status)?;
        let id = request.into_inner().source_id;
        let sources = if id.is_empty() {
            self.shared
                .runners
                .iter()
                .map(|r| status::source_info(r))
                .collect()
        } else {
            vec![status::source_info(status::runner(&self.shared, &id)?)]
        };
        Ok(Response::new(pb::GetSourceInfoResponse { sources }))
    }

    async fn pause_sync(
        &self,
        request: Request<pb::PauseSyncRequest>,
    ) -> Result<Response<pb::PauseSyncResponse>, Status> {
        self.allow(&request, Group::Control)?;
        let r = status::runner(&self.shared, &request.into_inner().source_id)?;
        r.source.pause();
        r.refresh();
        Ok(Response::new(pb::PauseSyncResponse {
            state: pb::ServiceState::Paused as i32,
        }))
    }

    async fn resume_sync(
        &self,
        request: Request<pb::ResumeSyncRequest>,
    ) -> Result<Response<pb::ResumeSyncResponse>, Status> {
        self.allow(&request, Group::Control)?;
        let r = status::runner(&self.shared, &request.into_inner().source_id)?;
        r.source.resume();
        r.refresh();
        Ok(Response::new(pb::ResumeSyncResponse {
            state: pb::ServiceState::Streaming as i32,
        }))
    }

    async fn list_tables(
        &self,
        request: Request<pb::ListTablesRequest>,
    ) -> Result<Response<pb::ListTablesResponse>, Status> {
        self.allow(&request, Group::Status)?;
        let mut tables = Vec::new();
        for r in &self.shared.runners {
            let key = match self.memory_table(&r.table.schema, &r.table.table) {
                Ok(t) => t.key_fields().to_vec(),
                Err(_) => r.key_fields.clone(),
            };
            for p in &r.pipelines {
                let target_config = serde_json::json!({"index_fields": p.target.index_fields()});
                tables.push(pb::TableConfig {
                    schema: r.table.schema.clone(),
                    table: r.table.table.clone(),
                    primary_key: key.join(","),
                    source_id: r.id.clone(),
                    source_type: "archive".into(),
                    source_config: None,
                    target_type: p.target.kind().into(),
                    target_config: status::details(&target_config),
                });
            }
        }
        Ok(Response::new(pb::ListTablesResponse { tables }))
    }

    async fn get_table_schema(
        &self,
        request: Request<pb::GetTableSchemaRequest>,
    ) -> Result<Response<pb::GetTableSchemaResponse>, Status> {
        self.allow(&request, Group::Status)?;
        let r = request.into_inner();
        let t = self.memory_table(&r.schema, &r.table)?;
        let columns = t.columns();
        if columns.is_empty() {
            return Err(Status::not_found(format!(
                "no schema for {}.{} (its baseline is not loaded yet, or its archive declares no columns)",
                r.schema, r.table
            )));
        }
        Ok(Response::new(pb::GetTableSchemaResponse {
            columns: columns.iter().map(status::column).collect(),
        }))
    }

    async fn reset_source(
        &self,
        _: Request<pb::ResetSourceRequest>,
    ) -> Result<Response<pb::ResetSourceResponse>, Status> {
        Err(unimplemented("ResetSource"))
    }

    async fn drain_replication(
        &self,
        _: Request<pb::DrainReplicationRequest>,
    ) -> Result<Response<pb::DrainReplicationResponse>, Status> {
        Err(unimplemented("DrainReplication"))
    }

    async fn create_snapshot(
        &self,
        _: Request<pb::CreateSnapshotRequest>,
    ) -> Result<Response<pb::CreateSnapshotResponse>, Status> {
        Err(unimplemented("CreateSnapshot"))
    }

    async fn list_snapshots(
        &self,
        _: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<pb::ListSnapshotsResponse>, Status> {
        Err(unimplemented("ListSnapshots"))
    }

    async fn inspect_snapshot(
        &self,
        _: Request<pb::InspectSnapshotRequest>,
    ) -> Result<Response<pb::InspectSnapshotResponse>, Status> {
        Err(unimplemented("InspectSnapshot"))
    }

    async fn restore_snapshot(
        &self,
        _: Request<pb::RestoreSnapshotRequest>,
    ) -> Result<Response<pb::RestoreSnapshotResponse>, Status> {
        Err(unimplemented("RestoreSnapshot"))
    }

    async fn delete_snapshot(
        &self,
        _: Request<pb::DeleteSnapshotRequest>,
    ) -> Result<Response<pb::DeleteSnapshotResponse>, Status> {
        Err(unimplemented("DeleteSnapshot"))
    }

    async fn prune_snapshots(
        &self,
        _: Request<pb::PruneSnapshotsRequest>,
    ) -> Result<Response<pb::PruneSnapshotsResponse>, Status> {
        Err(unimplemented("PruneSnapshots"))
    }

    async fn list_dead_letters(
        &self,
        _: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        Err(unimplemented("ListDeadLetters"))
    }

    async fn replay_dead_letters(
        &self,
        _: Request<pb::ReplayDeadLettersRequest>,
    ) -> Result<Response<pb::ReplayDeadLettersResponse>, Status> {
        Err(unimplemented("ReplayDeadLetters"))
    }

    async fn purge_dead_letters(
        &self,
        _: Request<pb::PurgeDeadLettersRequest>,
    ) -> Result<Response<pb::PurgeDeadLettersResponse>, Status> {
        Err(unimplemented("PurgeDeadLetters"))
    }

    async fn start_replay(
        &self,
        _: Request<pb::StartReplayRequest>,
    ) -> Result<Response<pb::StartReplayResponse>, Status> {
        Err(unimplemented("StartReplay"))
    }

    async fn get_replay_status(
        &self,
        _: Request<pb::GetReplayStatusRequest>,
    ) -> Result<Response<pb::GetReplayStatusResponse>, Status> {
        Err(unimplemented("GetReplayStatus"))
    }

    async fn stop_replay(
        &self,
        _: Request<pb::StopReplayRequest>,
    ) -> Result<Response<pb::StopReplayResponse>, Status> {
        Err(unimplemented("StopReplay"))
    }

    async fn reload_table(
        &self,
        request: Request<pb::ReloadTableRequest>,
    ) -> Result<Response<pb::ReloadTableResponse>, Status> {
        self.allow(&request, Group::Control)?;
        let r = request.into_inner();
        let runner = status::runner(&self.shared, &r.source_id)?;
        let asked = format!("{}.{}", r.schema, r.table);
        if runner.table.schema != r.schema || runner.table.table != r.table {
            return Err(Status::not_found(format!(
                "source {:?} serves table {}, not {asked}",
                r.source_id, runner.table
            )));
        }
        runner.request_reload();
        Ok(Response::new(pb::ReloadTableResponse {
            accepted: true,
            message: format!("{asked}: reloading from the archive's latest baseline"),
        }))
    }

    async fn reload_all(
        &self,
        request: Request<pb::ReloadAllRequest>,
    ) -> Result<Response<pb::ReloadAllResponse>, Status> {
        self.allow(&request, Group::Control)?;
        let id = request.into_inner().source_id;
        let runner = status::runner(&self.shared, &id)?;
        runner.request_reload();
        Ok(Response::new(pb::ReloadAllResponse {
            accepted: true,
            message: format!(
                "source {id}: reloading {} from the archive's latest baseline",
                runner.table
            ),
        }))
    }
}
