//! WatchStatus: the engine's and its pipelines' state changes (sampled every
//! [`SAMPLE`]) and every applied change's action and position (no row values), filtered by
//! table (`schema.table`) and pipeline id.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use pb::watch_status_response::Event;
use tokio::sync::{broadcast, mpsc};
use tonic::Status;

use larch_laredo_api::v1 as pb;

use super::{Api, status};

pub type Events = Pin<Box<dyn Stream<Item = Result<pb::WatchStatusResponse, Status>> + Send>>;

/// How often states are compared.
const SAMPLE: Duration = Duration::from_millis(200);

type Sender = mpsc::Sender<Result<pb::WatchStatusResponse, Status>>;

fn event(e: Event) -> Result<pb::WatchStatusResponse, Status> {
    Ok(pb::WatchStatusResponse {
        timestamp: Some(status::now()),
        event: Some(e),
    })
}

pub fn start(api: &Api, req: pb::WatchStatusRequest) -> Events {
    let (tx, rx) = mpsc::channel(256);
    let wanted = move |table: &str, pipeline: &str| {
        (req.tables.is_empty() || req.tables.iter().any(|t| t == table))
            && (req.pipeline_ids.is_empty() || req.pipeline_ids.iter().any(|p| p == pipeline))
    };
    for r in &api.shared.runners {
        let table = r.table.to_string();
        for p in &r.pipelines {
            if p.target.kind() == "memory"
                && wanted(&table, &p.id)
                && let Some(t) = api.shared.tables.get(&table)
            {
                let rows = RowFeed {
                    pipeline: p.id.clone(),
                    table: r.table.clone(),
                };
                tokio::spawn(rows.run(t.changes(), tx.clone(), api.stop.clone()));
            }
        }
    }
    let pipelines: Vec<(String, std::sync::Arc<super::super::pipeline::Pipeline>)> = api
        .shared
        .runners
        .iter()
        .flat_map(|r| {
            let table = r.table.to_string();
            r.pipelines
                .iter()
                .filter(|p| wanted(&table, &p.id))
                .map(|p| (p.id.clone(), p.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    tokio::spawn(sample_states(api.clone(), pipelines, tx));
    super::query::receiver_stream(rx)
}

/// Sends each state change of the engine and of `pipelines` until the client goes or the
/// engine stops.
async fn sample_states(
    api: Api,
    pipelines: Vec<(String, std::sync::Arc<super::super::pipeline::Pipeline>)>,
    tx: Sender,
) {
    let mut service = status::service_state(&api.shared);
    let mut states: HashMap<String, pb::PipelineState> = pipelines
        .iter()
        .map(|(id, p)| (id.clone(), status::pipeline_state(p.state())))
        .collect();
    let mut every = tokio::time::interval(SAMPLE);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = api.stop.cancelled() => return,
            () = tx.closed() => return,
        }
        let now = status::service_state(&api.shared);
        if now != service {
            let e = Event::ServiceStateChange(pb::ServiceStateChange {
                old_state: service as i32,
                new_state: now as i32,
            });
            service = now;
            if tx.send(event(e)).await.is_err() {
                return;
            }
        }
        for (id, p) in &pipelines {
            let now = status::pipeline_state(p.state());
            let old = states.insert(id.clone(), now).unwrap_or(now);
            if old != now {
                let e = Event::PipelineStateChange(pb::PipelineStateChangeEvent {
                    pipeline_id: id.clone(),
                    old_state: old as i32,
                    new_state: now as i32,
                });
                if tx.send(event(e)).await.is_err() {
                    return;
                }
            }
        }
    }
}

struct RowFeed {
    pipeline: String,
    table: larch_archive::model::TableId,
}

impl RowFeed {
    async fn run(
        self,
        mut changes: broadcast::Receiver<std::sync::Arc<larch_archive::source::ChangeEvent>>,
        tx: Sender,
        stop: tokio_util::sync::CancellationToken,
    ) {
        loop {
            let next = tokio::select! {
                c = changes.recv() => c,
                () = stop.cancelled() => return,
                () = tx.closed() => return,
            };
            let item = match next {
                Ok(c) => event(Event::RowChange(pb::RowChange {
                    pipeline_id: self.pipeline.clone(),
                    schema: self.table.schema.clone(),
                    table: self.table.table.clone(),
                    action: c.action.as_str().into(),
                    position: c.position.clone(),
                    xid: 0,
                })),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    Err(Status::resource_exhausted(format!(
                        "this watcher fell {n} row changes behind and was dropped: watch again"
                    )))
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let last = item.is_err();
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    }
}
