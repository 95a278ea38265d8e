//! `larch archive inspect|verify|reconstruct`.

use std::io::Write;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::output::{self, Output, OutputArgs};
use super::{StoreArgs, parse_formats, parse_list, parse_table_arg};
use crate::archive::format::Format;
use crate::archive::manifest::{ArtifactKind, Manifest, format_time};
use crate::archive::model::{TableId, effective_key_fields};
use crate::archive::orphans::{Unreferenced, UnreferencedObject, find_unreferenced, remove};
use crate::archive::plan::{Plan, broken_link_reason, plan_head, short_chain};
use crate::archive::point_in_time::{PointInTime, Window, resolve, window};
use crate::archive::reader::ArchiveReader;
use crate::archive::split_run;
use crate::archive::store::spec::StoreKind;
use crate::archive::verify::verify;

#[derive(Subcommand, Debug)]
pub enum ArchiveCommand {
    /// Print the table's rows at the head or as of a position.
    #[command(after_help = super::env_section(&[super::env_help::S3]))]
    Reconstruct(ReconstructArgs),
    /// Describe an archive: table, epochs, head, artifacts, columns, chain health.
    #[command(after_help = super::env_section(&[super::env_help::S3]))]
    Inspect(InspectArgs),
    /// Check every object, size, checksum, record count and chain link; exit 1 listing problems.
    /// Also lists objects the manifest does not reference (orphans), which do not fail it.
    #[command(after_help = super::env_section(&[super::env_help::S3]))]
    Verify(VerifyArgs),
    /// Remove orphans: objects of epochs below the manifest's that it no longer lists, stored
    /// before the manifest (by the store's clock).
    /// A dry run unless --delete.
    #[command(after_help = super::env_section(&[super::env_help::S3]))]
    Gc(GcArgs),
    /// Look for the raw values of every masked column (read from the source database) in
    /// every object of the archive's current epoch; print the count per column (never the
    /// values) and record the result in the manifest. Exit 0 when clean, 1 when raw values
    /// were found, 2 on bad input.
    #[command(after_help = super::env_section(&[super::env_help::S3]))]
    LeakCheck(Box<super::leak_check::LeakCheckArgs>),
    /// `larch export` under laredo's name (`laredo archive export`): the same flags, but as in
    /// laredo `--table` is the table's name as it is (dots included) in `--schema` (default public).
    Export(Box<super::export::ExportArgs>),
}

/// Which archive: a store, and the key prefix of one table's archive on it.
#[derive(Args, Debug)]
pub struct ArchiveArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The archive's key prefix (the manifest is at KEY_PREFIX + manifest.json). Default:
    /// `<schema>.<table>/` with --table, else the store root.
    #[arg(long, conflicts_with = "table")]
    pub key_prefix: Option<String>,
    /// The table whose archive to read, `[schema.]name` (schema `public` when omitted): reads
    /// the key prefix `<schema>.<table>/` that `larch export` writes by default.
    #[arg(long, value_name = "[SCHEMA.]NAME", value_parser = parse_table_arg)]
    pub table: Option<TableId>,
    /// Formats to read, in preference order.
    #[arg(long, default_value = "jsonl,protobuf,jsonl+zstd")]
    pub format: String,
}

/// `--clock-allowance` of the commands that judge orphans by age.
#[derive(Args, Debug)]
pub struct ClockAllowanceArgs {
    /// An object counts as stored before the manifest only when its modification time is this
    /// much earlier than the manifest object's (both from the store's own clock, so no
    /// allowance for clock skew between machines is needed).
    #[arg(long, default_value = "0s", value_parser = parse_non_negative_duration)]
    pub clock_allowance: std::time::Duration,
}

#[derive(Args, Debug)]
pub struct ReconstructArgs {
    #[command(flatten)]
    pub archive: ArchiveArgs,
    /// Key fields (default: the manifest's primary key, else `id`).
    #[arg(long, value_delimiter = ',')]
    pub key_fields: Vec<String>,
    /// The point to reconstruct (default: the head): a position (`16/B374D848`), or an RFC 3339
    /// time (`2026-11-30T14:00:00Z`) for the state after the last transaction committed at or
    /// before it. Before the archive's start is an error naming its earliest point; past the
    /// head reads the head, with a notice.
    #[arg(long, value_name = "POSITION|TIME", value_parser = parse_point_in_time)]
    pub at: Option<PointInTime>,
    /// Without --at, print the state the diff chain reaches even when it stops before the
    /// manifest head (a warning says so); without this flag that is an error.
    #[arg(long)]
    pub allow_partial: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub archive: ArchiveArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub archive: ArchiveArgs,
    #[command(flatten)]
    pub clock: ClockAllowanceArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct GcArgs {
    #[command(flatten)]
    pub archive: ArchiveArgs,
    #[command(flatten)]
    pub clock: ClockAllowanceArgs,
    /// Delete (without it, only print what would be deleted).
    #[arg(long)]
    pub delete: bool,
    /// Also remove unreferenced uploads in epochs the manifest still lists (left by a writer
    /// killed before its commit). Only when no writer is running on the prefix.
    #[arg(long)]
    pub include_listed_epochs: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--at`: a position or an RFC 3339 time (the parser of every `--at`).
pub fn parse_point_in_time(s: &str) -> Result<PointInTime, String> {
    s.parse()
}

/// A duration, where zero is allowed (`0`, `0s`).
fn parse_non_negative_duration(s: &str) -> Result<std::time::Duration, String> {
    crate::duration::parse_non_negative(s)
}

impl ArchiveArgs {
    /// The key prefix: `--key-prefix`, else `<schema>.<table>/` of `--table`, else the root.
    pub fn key_prefix(&self) -> String {
        match (&self.key_prefix, &self.table) {
            (Some(p), _) => p.clone(),
            (None, Some(t)) => format!("{t}/"),
            (None, None) => String::new(),
        }
    }

    /// A reader on an existing archive. Creates nothing: a missing local root or manifest is an
    /// error naming what was tried and which archives the store does hold.
    pub(super) async fn reader(&self) -> anyhow::Result<ArchiveReader> {
        if self.store.store == StoreKind::Local
            && let Some(path) = &self.store.path
            && !path.is_dir()
        {
            let what = if path.exists() {
                "not a directory"
            } else {
                "no such directory"
            };
            bail!("--path {}: {what} (the local store root)", path.display());
        }
        let store = self.store.spec().open_for_reading().await?;
        let formats: Vec<Format> =
            parse_formats(&self.format).map_err(|e| anyhow::anyhow!("--format: {e}"))?;
        let reader = ArchiveReader::new(store, self.key_prefix(), formats)?;
        if reader.try_load_manifest().await?.is_none() {
            return Err(self.manifest_not_found(&reader).await);
        }
        Ok(reader)
    }

    /// `manifest not found`, with the prefix tried, where it came from, and the nearest
    /// prefixes of the store that do hold a manifest.
    async fn manifest_not_found(&self, reader: &ArchiveReader) -> anyhow::Error {
        let prefix = reader.key_prefix();
        let origin = match (&self.key_prefix, &self.table) {
            (Some(_), _) => "from --key-prefix".to_string(),
            (None, Some(t)) => format!("from --table {t}"),
            (None, None) => {
                "the store root: neither --key-prefix nor --table was given, and `larch export` writes <schema>.<table>/".to_string()
            }
        };
        let mut message = format!(
            "manifest not found: {} has no {} (key prefix {prefix:?}, {origin})",
            reader.store().name(),
            reader.manifest_key()
        );
        match reader.store().list("").await {
            Ok(objects) => {
                let mut held: Vec<String> = objects
                    .iter()
                    .filter_map(|o| o.key.strip_suffix(MANIFEST_FILE))
                    .filter(|p| p.is_empty() || p.ends_with('/'))
                    .map(str::to_string)
                    .collect();
                held.sort_by_key(|p| (strsim::levenshtein(p, prefix), p.clone()));
                if held.is_empty() {
                    message.push_str(
                        "; the store holds no archive (no manifest.json under any prefix)",
                    );
                } else {
                    let shown: Vec<String> = held
                        .iter()
                        .take(NEAREST_SHOWN)
                        .map(|p| format!("{p:?}"))
                        .collect();
                    let more = held.len().saturating_sub(NEAREST_SHOWN);
                    message.push_str(&format!(
                        "; nearest archives in this store: key prefix {}{} (pass --key-prefix PREFIX, or --table SCHEMA.TABLE for <schema>.<table>/)",
                        shown.join(", "),
                        if more > 0 { format!(" and {more} more") } else { String::new() }
                    ));
                }
            }
            Err(e) => message.push_str(&format!(
                "; listing the store to suggest a prefix failed: {e}"
            )),
        }
        anyhow::anyhow!(message)
    }
}

/// The manifest's object name under a key prefix.
const MANIFEST_FILE: &str = "manifest.json";
/// How many existing prefixes `manifest not found` suggests.
const NEAREST_SHOWN: usize = 3;

pub async fn run(cmd: ArchiveCommand) -> anyhow::Result<i32> {
    match cmd {
        ArchiveCommand::Reconstruct(a) => reconstruct(a).await,
        ArchiveCommand::Inspect(a) => inspect(a).await,
        ArchiveCommand::Verify(a) => run_verify(a).await,
        ArchiveCommand::Gc(a) => gc(a).await,
        ArchiveCommand::LeakCheck(a) => super::leak_check::run(*a).await,
        ArchiveCommand::Export(mut a) => {
            // laredo's `--table` is the table's name as it is (`--table a.b` is `public."a.b"`):
            // `--schema` defaults to `public` here, which makes `--table` literal.
            a.schema.get_or_insert_with(|| "public".to_string());
            super::export::run(*a).await
        }
    }
}

async fn reconstruct(args: ReconstructArgs) -> anyhow::Result<i32> {
    let reader = args.archive.reader().await?;
    let key_fields: Vec<String> = args.key_fields.iter().flat_map(|k| parse_list(k)).collect();
    let manifest = reader.load_manifest().await?;
    let resolution = match &args.at {
        Some(at) => {
            let r = resolve(&manifest, at)
                .with_context(|| format!("{}: --at {}", reader.manifest_key(), at.value()))?;
            if let Some(notice) = &r.notice {
                eprintln!("notice: {notice}");
            }
            Some(r)
        }
        None => None,
    };
    let plan = match &resolution {
        Some(r) => r.plan.clone(),
        None => plan_head(&manifest),
    };
    if args.at.is_none()
        && let Some(short) = short_chain(&manifest, &plan)
    {
        let what = format!("{}: {short}", reader.manifest_key());
        if !args.allow_partial {
            anyhow::bail!(
                "{what}; the archive cannot reproduce its head (see `larch archive verify`); pass \
                 --allow-partial to print the state at {} anyway",
                short.reached
            );
        }
        eprintln!(
            "warning: {what}; printing the partial state at {} (--allow-partial)",
            short.reached
        );
    }
    match crate::archive::model::check_key_fields(&key_fields, &manifest.columns) {
        Err(e) => anyhow::bail!("--key-fields: {e}"),
        Ok(Some(warning)) => eprintln!("warning: --key-fields: {warning}"),
        Ok(None) => {}
    }
    let key_fields = effective_key_fields(&key_fields, &manifest.columns);
    let folded = reader.reconstruct(&plan, &key_fields).await?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    write!(
        out,
        "{{\n  \"position\": {},\n",
        serde_json::to_string(&folded.position)?
    )?;
    if let Some(r) = &resolution {
        let time = r.time.map(|t| format_time(&t));
        write!(
            out,
            "  \"time\": {},\n  \"precision\": {},\n",
            serde_json::to_string(&time)?,
            serde_json::to_string(r.precision.as_str())?
        )?;
    }
    write!(
        out,
        "  \"row_count\": {},\n  \"rows\": [",
        folded.rows.len()
    )?;
    for (i, row) in folded.rows.values().enumerate() {
        out.write_all(if i == 0 { b"\n    " } else { b",\n    " })?;
        out.write_all(row.as_str().as_bytes())?;
    }
    out.write_all(if folded.rows.is_empty() {
        b"]\n}\n"
    } else {
        b"\n  ]\n}\n"
    })?;
    out.flush().context("writing to stdout")?;
    Ok(0)
}

async fn inspect(args: InspectArgs) -> anyhow::Result<i32> {
    let reader = args.archive.reader().await?;
    let manifest = reader.load_manifest().await?;
    let plan = plan_head(&manifest);
    let key_fields = effective_key_fields(&[], &manifest.columns);
    let broken = broken_links(&manifest);
    let reaches_head = crate::archive::position::same(&plan.head_position, &manifest.head_position);
    let restorable = window(&manifest);
    let format = args.output.format();
    if format != Output::Table {
        let doc = serde_json::json!({
            "table": manifest.table,
            "manifest_version": manifest.manifest_version,
            "epoch": manifest.epoch,
            "head_position": manifest.head_position,
            "updated_at": format_time(&manifest.updated_at),
            "key_fields": key_fields,
            "columns": manifest.columns,
            "transform": manifest.transform,
            "subset": manifest.subset,
            "artifacts": manifest.artifacts,
            "chain": {"snapshot_epoch": plan.snapshot.as_ref().map(|s| s.epoch), "diffs": plan.diffs.len(), "reaches": plan.head_position, "reaches_head": reaches_head, "broken_links": broken},
            "restorable": restorable,
        });
        output::print(&doc, format, String::new)?;
        return Ok(0);
    }
    println!("table:        {}", manifest.table);
    println!(
        "manifest:     {} (version {})",
        reader.manifest_key(),
        manifest.manifest_version
    );
    println!("epoch:        {}", manifest.epoch);
    println!("head:         {}", manifest.head_position);
    println!("updated at:   {}", format_time(&manifest.updated_at));
    println!("key fields:   {}", key_fields.join(", "));
    print_columns(&manifest);
    print_transform(&manifest);
    print_subset(&manifest);
    print_artifacts(&manifest);
    print_chain(&plan, reaches_head, &broken);
    print_restorable(restorable.as_ref());
    Ok(0)
}

/// Each diff whose link is broken, described.
fn broken_links(manifest: &Manifest) -> Vec<String> {
    manifest
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Diff)
        .filter_map(|a| {
            broken_link_reason(a).map(|r| {
                format!(
                    "diff {:?} -> {:?}: {r}",
                    a.from_position.as_deref().unwrap_or(""),
                    a.to_position
                )
            })
        })
        .collect()
}

fn print_columns(manifest: &Manifest) {
    if !manifest.columns.is_empty() {
        println!("columns:");
        for c in &manifest.columns {
            let pk = if c.primary_key {
                format!(" primary key #{}", c.primary_key_ordinal)
            } else {
                String::new()
            };
            println!(
                "  {:<24} {:<14} {}{pk}",
                c.name,
                c.type_name,
                if c.nullable { "null" } else { "not null" }
            );
        }
    }
}

/// The manifest's `transform.leak_check`, and whether it holds at the current head.
fn print_leak_check(manifest: &Manifest, check: Option<&crate::archive::masking::LeakCheckRecord>) {
    let Some(c) = check else {
        println!("leak check:   none (larch archive leak-check)");
        return;
    };
    let verdict = match (
        c.found,
        c.passed_at(manifest.epoch, &manifest.head_position),
    ) {
        (0, true) => "passed".to_string(),
        (0, false) => "passed at an earlier head (run it again for the current one)".to_string(),
        (n, _) => format!("FAILED: {n} raw values found"),
    };
    println!(
        "leak check:   {verdict}: epoch {} at {}, {} columns, {} values checked, {} found, {} (larch {})",
        c.epoch,
        c.position,
        c.columns.len(),
        c.values_checked,
        c.found,
        c.checked_at,
        c.larch_version
    );
}

fn print_transform(manifest: &Manifest) {
    match &manifest.transform {
        Some(t) => {
            println!(
                "transform:    {} (key {}, hash {}; undeclared columns: {})",
                if t.masks_anything() {
                    "masked"
                } else {
                    "every column kept"
                },
                t.key_id.as_deref().unwrap_or("none"),
                t.hash.as_deref().unwrap_or(if t.key_id.is_some() {
                    "larch-hash-1"
                } else {
                    "none"
                }),
                t.undeclared
            );
            if let Some(permute) = &t.permute {
                println!("  permuted columns: {permute} (unique in, unique out)");
            }
            for (column, how) in &t.columns {
                println!("  {column:<24} {how}");
            }
            print_leak_check(manifest, t.leak_check.as_ref());
        }
        None => println!("transform:    none (raw rows)"),
    }
}

fn print_subset(manifest: &Manifest) {
    match &manifest.subset {
        Some(sub) => {
            let mut parts = Vec::new();
            if let Some(w) = &sub.row_filter {
                parts.push(format!("where {w}"));
            }
            if let Some(p) = &sub.sample_percent {
                parts.push(format!("sample {p}% by {}", sub.sample_by.join(", ")));
            }
            if let Some(c) = &sub.closure {
                let kept = c.tables.get(&manifest.table).copied().unwrap_or_default();
                parts.push(format!(
                    "foreign key closure of {} tables at {} ({} rounds, {kept} rows kept here)",
                    c.tables.len(),
                    c.position,
                    c.rounds
                ));
            }
            println!("subset:       {}", parts.join("; "));
        }
        None => println!("subset:       none (every row)"),
    }
}

fn print_artifacts(manifest: &Manifest) {
    println!("artifacts:    {}", manifest.artifacts.len());
    for a in &manifest.artifacts {
        let formats: Vec<String> = a
            .formats
            .iter()
            .map(|(k, v)| format!("{k} {} B", v.size_bytes))
            .collect();
        match a.kind {
            ArtifactKind::Snapshot => println!(
                "  snapshot epoch={} at {} rows={} [{}]",
                a.epoch,
                a.to_position,
                a.row_count,
                formats.join(", ")
            ),
            ArtifactKind::Diff => println!(
                "  diff     epoch={} {} -> {} changes={} [{}]",
                a.epoch,
                a.from_position.as_deref().unwrap_or(""),
                a.to_position,
                a.change_count,
                formats.join(", ")
            ),
        }
    }
}

fn print_chain(plan: &Plan, reaches_head: bool, broken: &[String]) {
    match &plan.snapshot {
        Some(s) => println!(
            "chain:        snapshot epoch {} + {} diffs reaches {} ({})",
            s.epoch,
            plan.diffs.len(),
            plan.head_position,
            if reaches_head {
                "the head"
            } else {
                "NOT the head"
            }
        ),
        None => println!("chain:        no snapshot"),
    }
    for b in broken {
        println!("broken link:  {b}");
    }
}

fn print_restorable(restorable: Option<&Window>) {
    let time = |t: Option<chrono::DateTime<chrono::FixedOffset>>| {
        t.map(|t| format_time(&t))
            .unwrap_or_else(|| "no commit time recorded".into())
    };
    match restorable {
        Some(w) => {
            println!(
                "restorable:   from {} ({})",
                w.earliest_position,
                time(w.earliest_time)
            );
            println!(
                "              to   {} ({})",
                w.latest_position,
                time(w.latest_time)
            );
        }
        None => println!("restorable:   nothing (no snapshot)"),
    }
}

fn describe_unreferenced(o: &UnreferencedObject) -> String {
    format!(
        "{} ({} B, epoch {}, modified {}): {}",
        o.key,
        o.size,
        o.epoch,
        o.modified
            .map(|m| m.to_rfc3339())
            .unwrap_or_else(|| "unknown".into()),
        o.class.describe()
    )
}

async fn run_verify(args: VerifyArgs) -> anyhow::Result<i32> {
    let reader = args.archive.reader().await?;
    let (manifest, report) = verify(&reader).await?;
    let unreferenced = find_unreferenced(
        reader.store().as_ref(),
        reader.key_prefix(),
        &manifest,
        args.clock.clock_allowance,
    )
    .await?;
    let result = VerifyResult {
        manifest: reader.manifest_key(),
        ok: report.problems.is_empty(),
        artifacts: manifest.artifacts.len(),
        checked_objects: report.checked_objects,
        head_position: manifest.head_position.clone(),
        problems: report.problems.clone(),
        unreferenced: unreferenced.iter().map(UnreferencedView::of).collect(),
    };
    // The problems are the result: stdout, like `ok` (stderr is for errors that stop it).
    output::print(&result, args.output.format(), || {
        verify_text(&result, &unreferenced)
    })?;
    Ok(if result.ok { 0 } else { 1 })
}

/// What `larch archive verify -o json|yaml` prints.
#[derive(serde::Serialize)]
struct VerifyResult {
    manifest: String,
    ok: bool,
    artifacts: usize,
    checked_objects: usize,
    head_position: String,
    problems: Vec<String>,
    unreferenced: Vec<UnreferencedView>,
}

/// An object the manifest does not reference, as `verify` and `gc` print it.
#[derive(serde::Serialize)]
struct UnreferencedView {
    key: String,
    size: u64,
    epoch: i64,
    modified: Option<String>,
    class: String,
}

impl UnreferencedView {
    fn of(o: &UnreferencedObject) -> Self {
        UnreferencedView {
            key: o.key.clone(),
            size: o.size,
            epoch: o.epoch,
            modified: o.modified.map(|m| m.to_rfc3339()),
            class: o.class.describe().to_string(),
        }
    }
}

fn verify_text(result: &VerifyResult, unreferenced: &[UnreferencedObject]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for o in unreferenced {
        let _ = writeln!(out, "unreferenced: {}", describe_unreferenced(o));
    }
    if result.ok {
        let _ = writeln!(
            out,
            "ok: {} ({} artifacts, {} objects checked, head {})",
            result.manifest, result.artifacts, result.checked_objects, result.head_position
        );
        return out;
    }
    for p in &result.problems {
        let _ = writeln!(out, "problem: {p}");
    }
    let _ = writeln!(
        out,
        "{} problem(s) in {}",
        result.problems.len(),
        result.manifest
    );
    out
}

async fn gc(args: GcArgs) -> anyhow::Result<i32> {
    let reader = args.archive.reader().await?;
    let (manifest, revision) = reader.try_load_manifest().await?.ok_or_else(|| {
        crate::archive::error::ArchiveError::ManifestNotFound {
            key: reader.manifest_key(),
        }
    })?;
    let store = reader.store().as_ref();
    let found = find_unreferenced(
        store,
        reader.key_prefix(),
        &manifest,
        args.clock.clock_allowance,
    )
    .await?;
    let mut classes = vec![Unreferenced::Orphan];
    if args.include_listed_epochs {
        classes.push(Unreferenced::ListedEpoch);
    }
    let (chosen, kept): (Vec<_>, Vec<_>) = found.iter().partition(|o| classes.contains(&o.class));
    let split = split_leftovers(store, &reader.manifest_key(), reader.key_prefix(), &args).await?;
    let mut result = GcResult {
        key_prefix: reader.key_prefix().to_string(),
        dry_run: !args.delete,
        kept: kept.iter().map(|o| UnreferencedView::of(o)).collect(),
        chosen: chosen.iter().map(|o| UnreferencedView::of(o)).collect(),
        bytes: chosen.iter().map(|o| o.size).sum(),
        deleted: Vec::new(),
        split,
    };
    if args.delete {
        // A writer that committed since: its new objects were judged against an older manifest.
        let now = reader.try_load_manifest().await?.map(|(_, r)| r);
        if now.as_deref() != Some(revision.as_str()) {
            anyhow::bail!(
                "{} changed while gc ran (a writer is active): nothing deleted; run gc again",
                reader.manifest_key()
            );
        }
        let owned: Vec<UnreferencedObject> = chosen.into_iter().cloned().collect();
        result.deleted = remove(store, &owned, &classes)
            .await
            .with_context(|| format!("deleting orphans under {:?}", reader.key_prefix()))?;
        split_run::remove_leftovers(store, reader.key_prefix(), &result.split)
            .await
            .with_context(|| format!("deleting split leftovers under {:?}", reader.key_prefix()))?;
    }
    output::print(&result, args.output.format(), || gc_text(&result))?;
    Ok(0)
}

/// What `larch archive gc -o json|yaml` prints: `chosen` are the objects it deletes (or would,
/// in a dry run), `kept` the unreferenced ones it leaves.
#[derive(serde::Serialize)]
struct GcResult {
    key_prefix: String,
    dry_run: bool,
    kept: Vec<UnreferencedView>,
    chosen: Vec<UnreferencedView>,
    bytes: u64,
    deleted: Vec<String>,
    /// What dead split runs left (docs/export.md): removed with the orphans.
    split: split_run::SplitLeftovers,
}

/// The leftovers of dead split runs: uploads started before the manifest was stored (less the
/// clock allowance); with --include-listed-epochs the plan counts as dead too.
async fn split_leftovers(
    store: &dyn crate::archive::store::Store,
    manifest_key: &str,
    key_prefix: &str,
    args: &GcArgs,
) -> anyhow::Result<split_run::SplitLeftovers> {
    let allowance = chrono::Duration::from_std(args.clock.clock_allowance)?;
    let stored_at = store.head(manifest_key).await?.and_then(|o| o.modified);
    let before = stored_at.map(|t| t - allowance);
    let no_writer = args.include_listed_epochs;
    Ok(split_run::find_leftovers(store, key_prefix, before, no_writer).await?)
}

fn gc_text(r: &GcResult) -> String {
    use std::fmt::Write as _;
    let describe = |o: &UnreferencedView| {
        let modified = o.modified.as_deref().unwrap_or("unknown");
        format!(
            "{} ({} B, epoch {}, modified {modified}): {}",
            o.key, o.size, o.epoch, o.class
        )
    };
    let mut out = String::new();
    for o in &r.kept {
        let _ = writeln!(out, "keep:   {}", describe(o));
    }
    let verb = if r.dry_run { "would delete" } else { "deleted" };
    for key in &r.split.objects {
        let _ = writeln!(out, "{verb}: {key} (left by a dead split run)");
    }
    for u in &r.split.uploads {
        let _ = writeln!(
            out,
            "{verb}: multipart upload {} of {} (no live split plan names it)",
            u.upload_id, u.key
        );
    }
    if r.dry_run {
        for o in &r.chosen {
            let _ = writeln!(out, "would delete: {}", describe(o));
        }
        let _ = writeln!(
            out,
            "dry run: {} object(s), {} B would be deleted from {}; pass --delete to delete",
            r.chosen.len(),
            r.bytes,
            r.key_prefix
        );
        return out;
    }
    for k in &r.deleted {
        let _ = writeln!(out, "deleted: {k}");
    }
    let _ = writeln!(out, "deleted {} object(s), {} B", r.deleted.len(), r.bytes);
    out
}
