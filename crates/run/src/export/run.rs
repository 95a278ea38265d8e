//! `larch export` as a library call: [`run`] takes an [`ExportRequest`] (from the command's
//! flags, or as the operator hands it to its pods) and exports one table (one-shot, or
//! continuously with `follow`) or several tables at one position. docs/architecture.md.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::coordination::v1::Lease;
use larch_archive::format::Format;
use larch_archive::model::{ColumnSelection, TableId};
use larch_archive::source::SyncSource;
use larch_archive::store::Store;
use larch_archive::writer::{ArchiveWriter, WriterConfig};
use larch_contract::export_request::{self, ExportRequest};
use larch_core::failure::{self, Reason};
use larch_core::locks::MutexExt;
use larch_postgres::{PostgresConfig, PostgresSource, SessionLimits, SlotMode, SubqueryTables};

mod follow;
mod leak_check;
mod set;
mod validated;

use follow::{follow, follow_writer};
use set::export_set;

use super::lease::LeaderElector;
use super::status::{BASELINE, Shared, serve};
use super::subset::{SampleRule, Subset};
use super::transform::{Masking, TransformKey};

/// Where `follow` serves its HTTP endpoints without `listen`.
const DEFAULT_FOLLOW_LISTEN: &str = "127.0.0.1:8080";

/// Exit status of a continuous export that lost its Lease (W9): it stopped writing at once.
pub const EXIT_LEASE_LOST: i32 = failure::EXIT_LEASE_LOST;

/// The source database of an export: its connection string (never logged, never part of a
/// request) and the `larch export cleanup` command that reaches the same database.
pub struct SourceConnection {
    pub dsn: String,
    pub cleanup: CleanupCommand,
}

/// `larch export cleanup` with the export's connection flags (never the connection string),
/// and what the reader must know to run it.
#[derive(Clone, Debug, Default)]
pub struct CleanupCommand {
    /// `larch export cleanup [--connection-file F]`: pasteable as is.
    pub command: String,
    /// A sentence after the command (` (…)`), or empty.
    pub note: String,
}

impl CleanupCommand {
    /// The whole line for a slot and its publication.
    pub fn line(&self, slot: &str, publication: &str) -> String {
        format!(
            "{} --slot {slot} --publication {publication}{}",
            self.command, self.note
        )
    }
}

/// Runs `request`: returns the summary of a one-shot export (also written to its summary
/// file), `None` when a `follow` export stopped on a signal.
pub async fn run(
    request: ExportRequest,
    connection: SourceConnection,
) -> anyhow::Result<Option<serde_json::Value>> {
    if request.subset.is_some() {
        let tables =
            subset_table_ids(&request).map_err(|e| failure::tag(Reason::InvalidConfig, e))?;
        return export_set(&request, connection.dsn, tables).await.map(Some);
    }
    let mut tables = table_ids(&request).map_err(|e| failure::tag(Reason::InvalidConfig, e))?;
    // `--owner` is checked by its flag; a request's is checked here, before anything connects.
    if let Some(owner) = &request.owner {
        larch_postgres::ownership::check_owner(owner)
            .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!("owner {owner:?}: {e}")))?;
    }
    leak_check::refuse_unless_checkable(&request)?;
    refuse_misplaced_split(&request, tables.len())?;
    if tables.len() > 1 {
        return export_set(&request, connection.dsn, tables).await.map(Some);
    }
    let table = tables.remove(0);
    // Read and checked before the export connects.
    let masking = masking(&request)?;
    let subqueries = subquery_tables(&request, std::slice::from_ref(&table), masking.as_deref());
    let subset = subset(&request, &table, masking.as_deref(), subqueries.as_ref())?;
    let key_prefix = request
        .key_prefix
        .clone()
        .unwrap_or_else(|| format!("{table}/"));
    // The same rule the readers and the operator apply: no `..`, no leading `/`.
    larch_archive::store::check_key_prefix(&key_prefix)
        .map_err(|e| anyhow::Error::from(e).context("--key-prefix"))?;
    let mut config = source_config(&request, connection.dsn.clone(), &table, subset.as_ref())?;
    config.row_filter_subqueries = subqueries;
    // Before anything is written: `--require-validated` refuses here.
    let tables = std::slice::from_ref(&table);
    let preflight =
        validated::preflight(&request, &connection.dsn, tables, masking.as_deref()).await?;
    let store = request.store.open().await?;
    if request.follow {
        let writer = follow_writer(&request, &table, &key_prefix)?;
        let masked = follow::Masked { masking, preflight };
        return follow(
            &request,
            &connection.cleanup,
            config,
            table,
            store,
            writer,
            masked,
        )
        .await
        .map(|()| None);
    }
    let wc = writer_config(&request, &table, &key_prefix)?;
    let mut summary = one_shot(
        &request,
        config,
        table.clone(),
        store.clone(),
        wc,
        masking,
        subset,
    )
    .await?;
    if request.leak_check {
        let written = [(table, key_prefix)];
        let checked = leak_check::check_written(&request, &connection.dsn, store, &written).await?;
        summary["leak_check"] = checked
            .into_iter()
            .next()
            .map(|(_, f)| f)
            .unwrap_or_default();
    }
    validated::attach(&mut summary, preflight, true)?;
    let text = serde_json::to_string_pretty(&summary)?;
    write_summary(&request, &text)?;
    Ok(Some(summary))
}

/// The source's configuration for one table: its slot (and its mode), publication, session
/// limits, key fields and row filter.
pub(crate) fn source_config(
    request: &ExportRequest,
    dsn: String,
    table: &TableId,
    subset: Option<&Subset>,
) -> anyhow::Result<PostgresConfig> {
    let slot = request
        .slot
        .clone()
        .unwrap_or_else(|| PostgresConfig::default_name(table));
    let publication = request.publication.clone().unwrap_or_else(|| slot.clone());
    let mut config = PostgresConfig::new(dsn, vec![table.clone()], slot, publication);
    if let Some(owner) = &request.owner {
        config.owner = owner.clone();
    }
    config.limits = session_limits(request)?;
    config.slot_mode = match request.slot_mode {
        Some(export_request::SlotMode::Persistent) if !request.follow => failure::bail!(
            Reason::InvalidConfig,
            "--slot-mode persistent needs --follow: a one-shot export always uses a temporary slot \
             (a persistent one would keep WAL on the server after the export)"
        ),
        Some(mode) => slot_mode(mode),
        None if request.follow => SlotMode::Persistent,
        None => SlotMode::Temporary,
    };
    config.snapshot_only = !request.follow;
    config.key_fields = request.key_fields.clone();
    if let Some(p) = subset.and_then(|s| s.row_filter.clone()) {
        config.row_filters.insert(table.clone(), p);
    }
    Ok(config)
}

fn slot_mode(mode: export_request::SlotMode) -> SlotMode {
    match mode {
        export_request::SlotMode::Persistent => SlotMode::Persistent,
        export_request::SlotMode::Temporary => SlotMode::Temporary,
    }
}

/// A one-shot export of one table: the baseline, with its progress on `listen` while it copies.
async fn one_shot(
    request: &ExportRequest,
    config: PostgresConfig,
    table: TableId,
    store: Arc<dyn Store>,
    wc: WriterConfig,
    masking: Option<Arc<Masking>>,
    subset: Option<Subset>,
) -> anyhow::Result<serde_json::Value> {
    let source = Arc::new(PostgresSource::new(config));
    let shared = Shared::new(&table);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(listen) = &request.listen {
        let addr = serve(listen, shared.clone(), stop_rx).await?;
        eprintln!("larch export: exporting {table} (status on http://{addr})");
        shared.ready.send_replace(true);
    }
    // A split run's coordinator on Kubernetes holds its Lease from before it exports the
    // snapshot until it has committed (or given up): one coordinator writes.
    let lease = match &request.lease {
        Some(name) => Some(lease_elector(request, name).await?),
        None => None,
    };
    if let Some(e) = &lease {
        shared.status.locked().state = "WAITING_FOR_LEASE".into();
        follow::acquire_logging_holder(e).await;
    }
    shared.status.locked().state = "BASELINE".into();
    let progress = shared.start_progress(BASELINE, &table);
    let exporting = export(
        source.clone(),
        &table,
        store,
        wc.clone(),
        &progress,
        (masking.as_deref(), subset.as_ref()),
        Split {
            parts: request.split.map_or(1, usize::from),
            workers: request.split_workers,
            start_timeout: split_start_timeout(request)?,
            identity: coordinator_identity(request),
            formats: formats(request),
            key_fields: request.key_fields.clone(),
        },
    );
    let result = match &lease {
        Some(e) => tokio::select! {
            r = exporting => r,
            () = e.keep() => lease_lost(request.summary_file.as_deref()),
        },
        None => exporting.await,
    };
    if let Some(e) = &lease
        && let Err(err) = e.release().await
    {
        tracing::warn!(lease = %e.name, error = %err, "releasing the export lease");
    }
    stop_tx.send_replace(true);
    source.close().await;
    // Nothing of ours may stay: a publication an earlier, killed export made for this slot.
    match source.drop_publication_if_unused().await {
        Ok(true) => eprintln!(
            "larch export: dropped publication {}, left behind for slot {} by an earlier export",
            source.config().publication_name,
            source.config().slot_name
        ),
        Ok(false) => {}
        Err(e) if result.is_ok() => {
            tracing::warn!(error = %format!("{e:#}"), "could not check for a stale publication")
        }
        Err(_) => {}
    }
    let (position, rows, epoch) = result?;
    Ok(serde_json::json!({
        "epoch": epoch,
        "key_prefix": wc.key_prefix,
        "position": position,
        "row_count": rows,
        "table": table.to_string(),
    }))
}

/// `--split` cuts one table's one-shot export: refused with several tables or `--follow`.
fn refuse_misplaced_split(request: &ExportRequest, tables: usize) -> anyhow::Result<()> {
    match request.split {
        Some(0) => failure::bail!(Reason::InvalidConfig, "--split must be at least 1"),
        Some(n) if n > 1 && tables > 1 => failure::bail!(
            Reason::InvalidConfig,
            "--split {n} applies to one table (several tables are copied at once with --parallel)"
        ),
        Some(n) if n > 1 && request.follow => failure::bail!(
            Reason::InvalidConfig,
            "--split {n} applies to a one-shot export, not --follow"
        ),
        _ => {}
    }
    match (request.split, request.split_workers) {
        (_, Some(0)) => failure::bail!(Reason::InvalidConfig, "--split-workers must be at least 1"),
        (None, Some(m)) => failure::bail!(
            Reason::InvalidConfig,
            "--split-workers {m} needs --split N: the workers copy the N ranges"
        ),
        (Some(_), Some(_)) if tables > 1 || request.follow || request.subset.is_some() => {
            failure::bail!(
                Reason::InvalidConfig,
                "--split-workers applies to a one-shot export of one table"
            )
        }
        (_, None) if request.split_workers_start_timeout.is_some() => failure::bail!(
            Reason::InvalidConfig,
            "--split-workers-start-timeout needs --split-workers: it bounds the wait for them"
        ),
        _ => split_start_timeout(request).map(|_| ()),
    }
}

/// How long a split's coordinator waits for each worker to start (default 10m).
fn split_start_timeout(request: &ExportRequest) -> anyhow::Result<Duration> {
    duration(
        request.split_workers_start_timeout.as_deref(),
        "--split-workers-start-timeout",
        "10m",
        larch_core::duration::parse_positive,
    )
}

/// The summary to `summary_file`, when the request names one.
fn write_summary(request: &ExportRequest, text: &str) -> anyhow::Result<()> {
    if let Some(path) = &request.summary_file {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("writing --summary-file {}", path.display()))?;
    }
    Ok(())
}

/// What the row filters' subqueries may read: the tables of this export, each with the columns
/// it exports unmasked; None (no subquery) unless `--where-subqueries` or the rules'
/// `subqueries: true` enable them.
pub(crate) fn subquery_tables(
    request: &ExportRequest,
    tables: &[TableId],
    masking: Option<&Masking>,
) -> Option<SubqueryTables> {
    let rules = masking.map(Masking::rules);
    if !request.where_subqueries && !rules.is_some_and(|r| r.subqueries) {
        return None;
    }
    let columns = |t: &TableId| rules.map_or(ColumnSelection::All, |r| r.unmasked_columns(t));
    Some(tables.iter().map(|t| (t.clone(), columns(t))).collect())
}

/// The subset of `table` from `where`/`sample` and the table's `where:`/`sample:` in the
/// transform rules (one place each); refused with `follow`, whose diffs would not respect it.
pub(crate) fn subset(
    request: &ExportRequest,
    table: &TableId,
    masking: Option<&Masking>,
    subqueries: Option<&SubqueryTables>,
) -> anyhow::Result<Option<Subset>> {
    let from_rules = masking
        .and_then(|m| m.rules().tables.get(&table.to_string()))
        .map(Subset::from)
        .unwrap_or_default();
    let mut subset = from_rules.clone();
    if let Some(p) = &request.row_filter {
        if from_rules.row_filter.is_some() {
            failure::bail!(
                Reason::InvalidConfig,
                "--where and the transform rules' `where:` of table {table} both filter rows: give one"
            );
        }
        subset.row_filter = Some(p.clone());
    }
    if let Some(percent) = request.sample {
        if from_rules.sample.is_some() {
            failure::bail!(
                Reason::InvalidConfig,
                "--sample and the transform rules' `sample:` of table {table} both sample rows: give one"
            );
        }
        subset.sample = Some(SampleRule {
            percent,
            by: request.sample_by.clone(),
        });
    }
    if subset.is_empty() {
        return Ok(None);
    }
    if request.follow {
        failure::bail!(
            Reason::InvalidConfig,
            "a row filter or sample (--where, --sample, `where:`/`sample:` of table {table}) \
             applies to a one-shot export only: the diffs of --follow would not respect it"
        );
    }
    subset
        .check(table, subqueries)
        .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!(e)))?;
    Ok(Some(subset))
}

/// A duration of the request (`field` as its flag), or `default`; refused: an invalid config.
fn duration(
    value: Option<&str>,
    field: &str,
    default: &str,
    parse: fn(&str) -> Result<Duration, String>,
) -> anyhow::Result<Duration> {
    parse(value.unwrap_or(default))
        .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!("{field}: {e}")))
}

/// An optional duration of the request.
fn optional_duration(value: Option<&str>, field: &str) -> anyhow::Result<Option<Duration>> {
    value
        .map(|v| duration(Some(v), field, "", larch_core::duration::parse_positive))
        .transpose()
}

/// A fraction of the request (`0.5`), or 0 (no limit).
fn fraction(value: Option<&str>, field: &str) -> anyhow::Result<f64> {
    value.map_or(Ok(0.0), |v| {
        v.parse::<f64>()
            .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!("{field}: {v:?}: {e}")))
    })
}

/// The timeouts of the sessions on the source (`--statement-timeout`, …).
fn session_limits(request: &ExportRequest) -> anyhow::Result<SessionLimits> {
    use larch_core::duration::{parse_age, parse_positive};
    Ok(SessionLimits {
        statement_timeout: duration(
            request.statement_timeout.as_deref(),
            "--statement-timeout",
            "1m",
            parse_positive,
        )?,
        lock_timeout: duration(
            request.lock_timeout.as_deref(),
            "--lock-timeout",
            "10s",
            parse_positive,
        )?,
        idle_in_transaction_timeout: duration(
            request.idle_in_transaction_timeout.as_deref(),
            "--idle-in-transaction-timeout",
            "1m",
            parse_positive,
        )?,
        snapshot_max_age: duration(
            request.snapshot_max_age.as_deref(),
            "--snapshot-max-age",
            "24h",
            parse_age,
        )?,
    })
}

/// The transform and its key, checked before the export connects.
pub(crate) fn masking(request: &ExportRequest) -> anyhow::Result<Option<Arc<Masking>>> {
    let Some(rules) = &request.transform else {
        if request.transform_key_file.is_some() {
            failure::bail!(
                Reason::InvalidConfig,
                "--transform-key-file needs --transform FILE (or --transform-rules)"
            );
        }
        return Ok(None);
    };
    TransformKey::load(request.transform_key_file.as_deref())
        .and_then(|key| Masking::new(rules.clone(), key))
        .map(|m| Some(Arc::new(m)))
        .map_err(|e| failure::tag(Reason::InvalidConfig, e))
}

/// The export's Lease holder, from `lease*`.
async fn lease_elector(request: &ExportRequest, name: &str) -> anyhow::Result<LeaderElector> {
    let client = kube::Client::try_default().await.map_err(|e| {
        failure::tag(
            Reason::InvalidConfig,
            anyhow::Error::from(e)
                .context("--lease: no Kubernetes client configuration (in-cluster or KUBECONFIG)"),
        )
    })?;
    let ns = request
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let identity = request
        .lease_identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("larch-export-{}", std::process::id()));
    let lease_duration = duration(
        request.lease_duration.as_deref(),
        "--lease-duration",
        "15s",
        larch_core::duration::parse_positive,
    )?;
    if lease_duration < Duration::from_secs(3) {
        failure::bail!(
            Reason::InvalidConfig,
            "--lease-duration must be at least 3s"
        );
    }
    Ok(LeaderElector {
        api: kube::Api::<Lease>::namespaced(client, &ns),
        name: name.to_string(),
        identity,
        lease_duration,
        renew_deadline: lease_duration * 2 / 3,
        retry: lease_duration / 5,
    })
}

/// `[schema.]name` (with `schema`: the name as it is) for each table; a table named twice is
/// an error.
pub fn table_ids(request: &ExportRequest) -> anyhow::Result<Vec<TableId>> {
    if request.tables.is_empty() {
        bail!("no table to export: give --table");
    }
    let mut ids: Vec<TableId> = Vec::with_capacity(request.tables.len());
    for table in &request.tables {
        let id = match &request.schema {
            Some(schema) if !table.is_empty() => TableId::new(schema.clone(), table),
            _ => crate::restore::parse_table(table).map_err(|e| anyhow!("--table {table}: {e}"))?,
        };
        if ids.contains(&id) {
            bail!("--table {id} is given twice");
        }
        ids.push(id);
    }
    Ok(ids)
}

/// The `--table`s of an export with `--subset`: none is fine (the spec names its tables).
fn subset_table_ids(request: &ExportRequest) -> anyhow::Result<Vec<TableId>> {
    if request.tables.is_empty() {
        return Ok(Vec::new());
    }
    table_ids(request)
}

/// The request's formats: jsonl unless it names some.
pub(crate) fn formats(request: &ExportRequest) -> Vec<Format> {
    if request.formats.is_empty() {
        vec![Format::Jsonl]
    } else {
        request.formats.clone()
    }
}

/// The writer of one table's archive at `key_prefix`: its key fields, formats and retention.
fn writer_config(
    request: &ExportRequest,
    table: &TableId,
    key_prefix: &str,
) -> anyhow::Result<WriterConfig> {
    let formats = formats(request);
    let mut wc = WriterConfig::new(table.to_string(), key_prefix);
    wc.key_fields = request.key_fields.clone();
    wc.snapshot_formats = formats.clone();
    wc.diff_formats = formats;
    // Pruned after this run's own commit (W7, W10).
    wc.keep_epochs = request.keep_epochs;
    wc.max_age = request
        .max_age
        .as_deref()
        .map(|age| duration(Some(age), "--max-age", "", larch_core::duration::parse_age))
        .transpose()?;
    Ok(wc)
}

/// The temporary slot of a several-table export: one name per set of tables (in any order).
fn default_set_slot(tables: &[TableId]) -> String {
    use sha2::Digest;
    let mut names: Vec<String> = tables
        .iter()
        .map(|t| format!("{}.{}", t.schema, t.table))
        .collect();
    names.sort();
    let digest = sha2::Sha256::digest(names.join("\n"));
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("larch_set_{hex}")
}

async fn export(
    source: Arc<PostgresSource>,
    table: &TableId,
    store: Arc<dyn Store>,
    wc: WriterConfig,
    progress: &Arc<larch_core::progress::Progress>,
    (masking, subset): (Option<&Masking>, Option<&Subset>),
    split: Split,
) -> anyhow::Result<(String, i64, i64)> {
    // Checks the row filter too (EXPLAIN): an invalid predicate exports nothing.
    let schemas = source.init(std::slice::from_ref(table)).await?;
    // Checked before the archive is opened: a rule that does not fit exports nothing.
    if let (Some(m), Some(schema)) = (masking, source.table_schema(table)) {
        m.compile(&schema)
            .map_err(|e| failure::tag(Reason::InvalidConfig, e))?;
    }
    if let (Some(s), Some(schema)) = (subset, source.table_schema(table)) {
        s.sampler(&schema, masking.and_then(Masking::key))
            .map_err(|e| failure::tag(Reason::InvalidConfig, anyhow!(e)))?;
    }
    let mut writer = ArchiveWriter::open(vec![store], wc).await?;
    writer.set_columns(schemas.get(table).cloned().unwrap_or_default());

    let artifact = if let Some(workers) = split.workers {
        let coordination = super::split_coordinator::Coordination {
            parts: split.parts,
            workers,
            start_timeout: split.start_timeout,
            formats: split.formats,
            key_fields: split.key_fields,
            identity: split.identity,
        };
        let shape = (masking, subset);
        super::split_coordinator::snapshot_by_workers(
            source,
            table,
            &mut writer,
            progress,
            shape,
            coordination,
        )
        .await?
    } else if split.parts > 1 {
        let parts = split.parts;
        super::split::snapshot_split(source, table, &mut writer, progress, masking, subset, parts)
            .await?
    } else {
        super::snapshot_from_source(source, table, &mut writer, progress, masking, subset).await?
    };
    Ok((
        artifact.to_position.clone(),
        artifact.row_count,
        artifact.epoch,
    ))
}

/// How a one-shot export of one table reads it: in `parts` ranges, copied by `workers`
/// separate processes when given.
struct Split {
    parts: usize,
    workers: Option<u16>,
    /// How long the coordinator waits for each worker to start.
    start_timeout: Duration,
    identity: String,
    formats: Vec<Format>,
    key_fields: Vec<String>,
}

/// Who coordinates a split run (recorded in its plan): the Lease holder's identity, else the
/// host's (a pod's) name.
fn coordinator_identity(request: &ExportRequest) -> String {
    request
        .lease_identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("larch-export-{}", std::process::id()))
}

/// Lease lost: stop writing now — no final diff, no further request from any task — by
/// exiting the process with [`EXIT_LEASE_LOST`] (W9), the reason in the termination message.
fn lease_lost(termination_file: Option<&Path>) -> ! {
    let why =
        "lost the export lease: stopped writing; exiting so the Lease holder is the only writer";
    tracing::error!("{why}");
    let code = crate::reasons::report(
        termination_file,
        &failure::tag(Reason::LeaseLost, anyhow!(why)),
    );
    std::process::exit(code)
}
