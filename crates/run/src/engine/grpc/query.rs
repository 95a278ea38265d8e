//! `laredo.v1.LaredoQueryService` over the memory tables.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status};

use larch_laredo_api::v1 as pb;
use larch_laredo_api::v1::laredo_query_service_server::LaredoQueryService;

use super::super::targets::Target;
use super::super::targets::memory::{MAX_PAGE, MemoryTarget, QueryError};
use super::{Api, Group, status};

pub type Changes = Pin<Box<dyn Stream<Item = Result<pb::SubscribeResponse, Status>> + Send>>;

fn bad_query(e: QueryError) -> Status {
    Status::invalid_argument(e.0)
}

/// The fields a lookup matches: `index_name` is an index field, several joined by commas, or
/// empty for every index field (laredo's lookup fields), else the primary key.
fn lookup_fields(t: &MemoryTarget, index_name: &str) -> Vec<String> {
    if !index_name.is_empty() {
        return index_name
            .split(',')
            .map(|f| f.trim().to_string())
            .collect();
    }
    let index = Target::index_fields(t);
    if index.is_empty() {
        t.key_fields().to_vec()
    } else {
        index.to_vec()
    }
}

/// Up to `limit` rows (all with `None`) whose `fields` equal `values`: by primary key when
/// they are the key, else through the indexes.
fn lookup(
    t: &MemoryTarget,
    index_name: &str,
    values: &[pbjson_types::Value],
    limit: Option<usize>,
) -> Result<Vec<String>, Status> {
    let fields = lookup_fields(t, index_name);
    if fields.len() != values.len() {
        return Err(Status::invalid_argument(format!(
            "key_values: {} value(s) for {} field(s) ({})",
            values.len(),
            fields.len(),
            fields.join(", ")
        )));
    }
    let params: Vec<(String, String)> = fields
        .into_iter()
        .zip(values.iter().map(status::key_text))
        .collect();
    let key = t.key_fields();
    if params.len() == key.len() && params.iter().all(|(f, _)| key.contains(f)) {
        return Ok(t.get(&params).map_err(bad_query)?.into_iter().collect());
    }
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let want = limit.map_or(MAX_PAGE, |l| (l - rows.len()).min(MAX_PAGE));
        let mut page = params.clone();
        page.push(("limit".into(), want.to_string()));
        if let Some(a) = after.take() {
            page.push(("after".into(), a));
        }
        let (found, next) = t.page_texts(&page).map_err(bad_query)?;
        rows.extend(found);
        match next {
            Some(n) if limit.is_none_or(|l| rows.len() < l) => after = Some(n),
            _ => break,
        }
    }
    Ok(rows)
}

#[tonic::async_trait]
impl LaredoQueryService for Api {
    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        self.allow(&request, Group::Reads)?;
        let r = request.into_inner();
        let t = self.memory_table(&r.schema, &r.table)?;
        let rows = lookup(&t, &r.index_name, &r.key_values, Some(1))?;
        Ok(Response::new(pb::LookupResponse {
            found: !rows.is_empty(),
            row: rows.first().map(|r| status::row(r)).transpose()?,
        }))
    }

    async fn lookup_all(
        &self,
        request: Request<pb::LookupAllRequest>,
    ) -> Result<Response<pb::LookupAllResponse>, Status> {
        self.allow(&request, Group::Reads)?;
        let r = request.into_inner();
        let t = self.memory_table(&r.schema, &r.table)?;
        if r.index_name.is_empty() {
            return Err(Status::invalid_argument("index_name is required"));
        }
        let rows = lookup(&t, &r.index_name, &r.key_values, None)?;
        Ok(Response::new(pb::LookupAllResponse {
            rows: rows
                .iter()
                .map(|r| status::row(r))
                .collect::<Result<_, _>>()?,
        }))
    }

    async fn get_row(
        &self,
        request: Request<pb::GetRowRequest>,
    ) -> Result<Response<pb::GetRowResponse>, Status> {
        self.allow(&request, Group::Reads)?;
        let r = request.into_inner();
        let t = self.memory_table(&r.schema, &r.table)?;
        let key = t.key_fields();
        let [field] = &*key else {
            return Err(Status::invalid_argument(format!(
                "{}.{} has a composite primary key ({}): use Lookup with one key value per field",
                r.schema,
                r.table,
                key.join(", ")
            )));
        };
        let row = t
            .get(&[(field.clone(), r.primary_key.to_string())])
            .map_err(bad_query)?;
        Ok(Response::new(pb::GetRowResponse {
            found: row.is_some(),
            row: row.as_deref().map(status::row).transpose()?,
        }))
    }

    async fn list_rows(
        &self,
        request: Request<pb::ListRowsRequest>,
    ) -> Result<Response<pb::ListRowsResponse>, Status> {
        self.allow(&request, Group::Reads)?;
        let r = request.into_inner();
        let t = self.memory_table(&r.schema, &r.table)?;
        let size = match r.page_size {
            n if n <= 0 => 100,
            n => (n as usize).min(MAX_PAGE),
        };
        let mut params = vec![("limit".to_string(), size.to_string())];
        if !r.page_token.is_empty() {
            params.push(("after".into(), r.page_token));
        }
        let (rows, next) = t.page_texts(&params).map_err(bad_query)?;
        Ok(Response::new(pb::ListRowsResponse {
            rows: rows
                .iter()
                .map(|r| status::row(r))
                .collect::<Result<_, _>>()?,
            next_page_token: next.unwrap_or_default(),
            total_count: t.len() as i64,
        }))
    }

    async fn count_rows(
        &self,
        request: Request<pb::CountRowsRequest>,
    ) -> Result<Response<pb::CountRowsResponse>, Status> {
        self.allow(&request, Group::Reads)?;
        let r = request.into_inner();
        let t = self.memory_table(&r.schema, &r.table)?;
        Ok(Response::new(pb::CountRowsResponse {
            count: t.len() as i64,
        }))
    }

    type SubscribeStream = Changes;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Changes>, Status> {
        self.allow(&request, Group::Reads)?;
        let r = request.into_inner();
        let t = self.memory_table(&r.schema, &r.table)?;
        // Listening before the rows are read: a change made meanwhile is sent after them
        // (at least once), never lost.
        let changes = t.changes();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(feed(t, changes, r.replay_existing, tx, self.stop.clone()));
        Ok(Response::new(receiver_stream(rx)))
    }
}

/// A channel's receiving end as a stream.
pub fn receiver_stream<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
) -> Pin<Box<dyn Stream<Item = T> + Send>> {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

type Sender = mpsc::Sender<Result<pb::SubscribeResponse, Status>>;

/// Sends the table's rows as INSERTs (with `replay`), then its changes, until the client goes,
/// the engine stops, or the client falls too far behind (then a last error says so).
async fn feed(
    t: Arc<MemoryTarget>,
    mut changes: broadcast::Receiver<Arc<larch_archive::source::ChangeEvent>>,
    replay: bool,
    tx: Sender,
    stop: tokio_util::sync::CancellationToken,
) {
    if replay && replay_rows(&t, &tx).await.is_err() {
        return;
    }
    loop {
        let next = tokio::select! {
            c = changes.recv() => c,
            () = stop.cancelled() => return,
            () = tx.closed() => return,
        };
        let item = match next {
            Ok(c) => status::subscribe_response(&c),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                Err(Status::resource_exhausted(format!(
                    "this subscriber fell {n} changes behind the table and was dropped: subscribe again (replay_existing reloads the rows)"
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

/// The table's rows, a page at a time (never the whole table in memory at once).
async fn replay_rows(t: &MemoryTarget, tx: &Sender) -> Result<(), ()> {
    let mut after: Option<String> = None;
    loop {
        let mut params = vec![("limit".to_string(), "1000".to_string())];
        if let Some(a) = after.take() {
            params.push(("after".into(), a));
        }
        let (rows, next) = t.page_texts(&params).map_err(|_| ())?;
        for text in rows {
            let item = status::row(&text).map(|row| pb::SubscribeResponse {
                action: "INSERT".into(),
                position: t.position().unwrap_or_default(),
                timestamp: Some(status::now()),
                new_values: Some(row),
                ..Default::default()
            });
            tx.send(item).await.map_err(|_| ())?;
        }
        match next {
            Some(n) => after = Some(n),
            None => return Ok(()),
        }
    }
}
