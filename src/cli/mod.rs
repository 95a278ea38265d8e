//! The `larch` command line: argument parsing, wiring, exit codes.

pub mod archive;
pub mod engine;
pub mod engine_client;
pub mod export;
mod export_check;
pub mod leak_check;
pub mod operator;
pub mod output;
pub mod restore;
pub mod slot;
pub mod split_worker;
pub mod status;
pub mod subset;
pub mod transform;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::archive::format::Format;
use crate::archive::store::spec::{StoreKind, StoreSpec};

/// Environment variables, per command, shown in `--help` (`LARCH_*`, libpq's, the AWS SDK's).
pub mod env_help {
    pub const S3: &str = "  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
                      S3 credentials (--store s3); also AWS_PROFILE, AWS_CONFIG_FILE,
                      AWS_SHARED_CREDENTIALS_FILE, and AWS_WEB_IDENTITY_TOKEN_FILE with
                      AWS_ROLE_ARN (the SDK's ambient chain)
  AWS_REGION, AWS_DEFAULT_REGION
                      S3 region when --region is not given (then the profile, then us-east-1)
  AWS_CA_BUNDLE       PEM CA bundle trusted for an https S3 endpoint (a private CA)";
    /// The engine's stores are configured in its file, not by flags.
    pub const S3_CONFIG: &str = "  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
                      S3 credentials of an s3 store whose configuration sets no
                      access_key_id_file / secret_access_key_file; also the SDK's ambient
                      chain (AWS_PROFILE, AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, ...)
  AWS_REGION, AWS_DEFAULT_REGION
                      S3 region of a store whose configuration sets no region
  AWS_CA_BUNDLE       PEM CA bundle trusted for an https S3 endpoint (a private CA)";
    pub const LOG: &str =
        "  LARCH_LOG           log filter (tracing syntax: info, debug, larch=debug; default
                      info) when --log-level is not given; logs go to stderr
  LARCH_LOG_FORMAT    --log-format: json or text (default: text on a terminal, else json)
  LARCH_PROGRESS_INTERVAL
                      how often a copy, restore or load logs its progress (default 10s)";
    /// Shown only in builds with the test-only `crashpoints` feature, where it works.
    #[cfg(feature = "crashpoints")]
    pub const CRASH: &str =
        "  LARCH_CRASH_AT      tests only (this build has the crashpoints feature): POINT[@N]
                      kills the process at a crash point (docs/archive.md);
                      LARCH_PAUSE_AT=POINT=MS holds a race window open for MS
                      milliseconds; never set either in production";
    #[cfg(not(feature = "crashpoints"))]
    pub const CRASH: &str = "";
    pub const PG: &str =
        "  LARCH_PG_DSN        the PostgreSQL connection string when neither --connection nor
                      --connection-file is given
  PGUSER, PGPASSWORD  user and password when the connection string names none";
    pub const KUBE: &str =
        "  KUBECONFIG          Kubernetes client configuration (in a pod: its service account)";
    /// An Indexed Job's pod index, for `larch export split-worker`.
    pub const SPLIT_WORKER: &str = "  JOB_COMPLETION_INDEX
                      export split-worker: --index (Kubernetes sets it in the pods of an
                      Indexed Job)";
    /// The export's Lease holder.
    pub const LEASE: &str =
        "  HOSTNAME            the Lease holder identity when neither --lease-identity nor
                      POD_NAME is set";
}

use env_help::{CRASH, KUBE, LEASE, LOG, PG, S3, SPLIT_WORKER};

/// The `Environment:` and `Exit status:` sections of a command's `--help`.
pub fn env_section(blocks: &[&str]) -> String {
    let blocks: Vec<&str> = blocks.iter().copied().filter(|b| !b.is_empty()).collect();
    format!("Environment:\n{}\n\n{EXIT_STATUS}", blocks.join("\n"))
}

/// Exit codes follow the failure's reason (`larch_core::failure::Reason::exit_code`).
const EXIT_STATUS: &str = "Exit status:
  0  success
  1  a failure that may clear by itself (a connection, a store unavailable) or an
     unclassified one; `archive verify`: problems found
  2  someone must act: bad arguments or configuration, a table, database or bucket missing,
     credentials or rights refused (the error names what)
  3  a continuous export lost its Lease to another holder (docs/postgres-source.md)";

fn all_env() -> String {
    env_section(&[
        PG,
        S3,
        KUBE,
        LEASE,
        SPLIT_WORKER,
        "  LARCH_EXPORT_LEASE, POD_NAME, POD_NAMESPACE
                      export: --lease, --lease-identity, --lease-namespace
  LARCH_TRANSFORM_KEY export: the masking hash key when no --transform-key-file is given
  LARCH_ENGINE_TOKEN  engine: the API token when no --token-file is given
  LAREDO_ADDRESS      engine status|ready|tables|query|...: the engine when no --addr is given
  LARCH_IMAGE, LARCH_NAMESPACE, LARCH_LEADER_ELECTION, LARCH_DISABLE_SOURCE_SETS,
  LARCH_NETWORK_POLICIES, LARCH_POD_RUN_AS_USER, LARCH_EXPORT_LEASE_ROLE,
  LARCH_NO_GENERATED_ENGINE_TOKENS, POD_SERVICE_ACCOUNT
                      operator: --image, --namespace, --leader-election,
                      --disable-source-sets, --network-policies, --pod-run-as-user,
                      --export-lease-role, --no-generated-engine-tokens, --service-account
  LARCH_MAX_MANIFEST_BYTES
                      the cap on a manifest read whole (default 64 MiB)",
        LOG,
        CRASH,
    ])
}

#[derive(Parser, Debug)]
#[command(
    name = "larch",
    version = env!("LARCH_VERSION"),
    about = "PostgreSQL tables into laredo-compatible archives, archives into live engines",
    after_help = all_env()
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub log: LogArgs,
}

/// How a command logs (every command takes these, before or after its name).
#[derive(Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log level (error, warn, info, debug, trace) or a filter in tracing's syntax
    /// (`info,larch=debug`); overrides LARCH_LOG (default info).
    #[arg(long, global = true, value_name = "LEVEL", value_parser = parse_log_filter)]
    pub log_level: Option<String>,
    /// Log lines as `json` (one object per line) or `text`; default: text when stderr is a
    /// terminal, else json.
    #[arg(long, global = true, value_enum, env = "LARCH_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// `--log-level`: refused at parse time when tracing cannot read it.
fn parse_log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

/// The process's `--log-level`/`--log-format`, set once before the command runs.
static LOG_SETTINGS: std::sync::OnceLock<LogArgs> = std::sync::OnceLock::new();

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Inspect, verify and reconstruct archives.
    #[command(subcommand)]
    Archive(archive::ArchiveCommand),
    /// Export a PostgreSQL table into an archive (one base snapshot, a new epoch).
    Export(Box<export::ExportArgs>),
    /// Replay archives into live targets (memory tables over HTTP and gRPC, PostgreSQL); with a
    /// verb (status, ready, tables, query, …), a client of a running engine's gRPC API.
    Engine(engine::EngineArgs),
    /// Restore tables of an archive into a PostgreSQL database, at the head or as of a point,
    /// in one transaction, and exit (docs/restore.md).
    #[command(after_help = env_section(&[PG, S3, LOG]))]
    Restore(Box<restore::RestoreArgs>),
    /// Print the operator's CustomResourceDefinitions (multi-document YAML).
    Crd,
    /// Run the Kubernetes operator (ArchiveExport and ArchiveSource controllers).
    Operator(operator::OperatorArgs),
    /// Every ArchiveExport, ArchiveSource, ArchiveRestore and ArchiveSourceSet of the cluster and
    /// recent warning Events, or one object (`KIND/NAME`) with its conditions and Events, read
    /// with your kubeconfig (also `kubectl larch status`: install the binary as `kubectl-larch`
    /// on PATH).
    #[command(after_help = env_section(&[KUBE]))]
    Status(status::StatusArgs),
    /// The logs of the pods the operator runs for one object (`KIND/NAME`): the newest pod's, or
    /// every pod's with `--all`; `-f` follows (also `kubectl larch logs`).
    #[command(after_help = env_section(&[KUBE]))]
    Logs(status::LogsArgs),
    /// Start a new run of a OneShot ArchiveExport or an ArchiveRestore now (`KIND/NAME`): sets
    /// its `larch.dev/run-requested` annotation to the current time (also `kubectl larch
    /// run-now`).
    #[command(after_help = env_section(&[KUBE]))]
    RunNow(status::RunNowArgs),
    /// Help writing masking rules: `suggest` proposes rules for the columns that look
    /// sensitive, `preview` prints rows raw beside masked (docs/masking.md).
    #[command(subcommand)]
    Transform(transform::TransformCommand),
    /// Subsets that follow foreign keys: `plan` prints the closure of a spec and its
    /// estimated rows without exporting (docs/subsetting.md).
    #[command(subcommand)]
    Subset(subset::SubsetCommand),
}

/// Where an archive lives: `--store local --path DIR` or `--store s3 --bucket B ...`.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Store type.
    #[arg(long, value_enum, default_value_t = StoreKind::Local)]
    pub store: StoreKind,
    /// Local store root directory.
    #[arg(long)]
    pub path: Option<std::path::PathBuf>,
    /// S3 bucket.
    #[arg(long)]
    pub bucket: Option<String>,
    /// S3 destination prefix (prepended verbatim to every key).
    #[arg(long)]
    pub prefix: Option<String>,
    /// S3 endpoint URL (S3-compatible stores).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// S3 region.
    #[arg(long)]
    pub region: Option<String>,
    /// Path-style S3 addressing (most S3-compatible stores need it).
    #[arg(long)]
    pub path_style: bool,
}

impl StoreArgs {
    pub fn spec(&self) -> StoreSpec {
        StoreSpec {
            kind: self.store,
            path: self.path.clone(),
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
            path_style: self.path_style || self.endpoint.is_some(),
            ..Default::default()
        }
    }
}

/// Parses `--format a,b` lists.
pub fn parse_formats(s: &str) -> Result<Vec<Format>, String> {
    Format::parse_list(s).map_err(|e| e.to_string())
}

/// Parses `--table [schema.]name`: `public` when the schema is omitted.
pub fn parse_table_arg(s: &str) -> Result<crate::archive::model::TableId, String> {
    use crate::archive::model::TableId;
    match s.split_once('.') {
        None if !s.is_empty() => Ok(TableId::new("public", s)),
        Some((schema, table)) if !schema.is_empty() && !table.is_empty() => {
            Ok(TableId::new(schema, table))
        }
        _ => Err(format!("{s:?} is not a table name: expected [schema.]name")),
    }
}

/// Parses `--key-fields a,b`.
pub fn parse_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Logs at `--log-level` (else `LARCH_LOG`, default `info`) on stderr, as JSON lines or text
/// (`--log-format`; text on a terminal), except the PostgreSQL driver's debug and trace lines
/// at every level: tokio-postgres logs each
/// statement's parameters at debug (`executing statement … with parameters: [...]`), which for
/// a masked export's look-ups are raw key values (docs/masking.md, "Logs").
pub fn init_tracing() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let settings = LOG_SETTINGS.get().cloned().unwrap_or_default();
    let filter = match &settings.log_level {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_env("LARCH_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let terminal = std::io::stderr().is_terminal();
    let format = settings.log_format.unwrap_or(if terminal {
        LogFormat::Text
    } else {
        LogFormat::Json
    });
    let lines = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| BarSafeStderr);
    let keep = || tracing_subscriber::filter::filter_fn(keep_line);
    let _ = match format {
        LogFormat::Json => lines.json().finish().with(keep()).try_init(),
        LogFormat::Text => lines.with_ansi(terminal).finish().with(keep()).try_init(),
    };
}

/// stderr for log lines: each is written with the progress bars cleared and drawn again after,
/// so a line never tears a bar (the formatter writes a line in one `write_all`).
struct BarSafeStderr;

impl std::io::Write for BarSafeStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        larch_core::progress::suspend_bars(|| std::io::stderr().write_all(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Drops the PostgreSQL driver's lines above info (they may carry statement parameters).
fn keep_line(meta: &tracing::Metadata<'_>) -> bool {
    !quiet_driver(meta.target()) || *meta.level() <= tracing::Level::INFO
}

/// Targets whose lines above info may carry statement parameters: the PostgreSQL driver's.
fn quiet_driver(target: &str) -> bool {
    target == "tokio_postgres" || target.starts_with("tokio_postgres::")
}

/// Commands whose output is a result on stdout, as opposed to a server's.
fn prints_a_result(command: &Command) -> bool {
    match command {
        Command::Archive(archive::ArchiveCommand::Export(_)) | Command::Export(_) => false,
        Command::Archive(_) | Command::Crd | Command::Status(_) => true,
        Command::Logs(_) | Command::RunNow(_) | Command::Transform(_) => true,
        Command::Subset(_) => true,
        Command::Engine(a) => a.client.is_some(),
        Command::Operator(_) | Command::Restore(_) => false,
    }
}

impl Command {
    /// Where a failure is reported for whoever runs the process (Kubernetes reads
    /// `/dev/termination-log`): see [`crate::failure`].
    fn termination_file(&self) -> Option<std::path::PathBuf> {
        let export = |a: &export::ExportArgs| match &a.command {
            Some(slot::ExportCommand::Cleanup(c)) => c.summary_file.clone(),
            Some(slot::ExportCommand::SlotStatus(_)) => None,
            Some(slot::ExportCommand::SplitWorker(w)) => w.termination_file(),
            // the operator's pods name it in their request (`--request`)
            None => a.summary_file.clone().or_else(|| {
                let request =
                    larch_contract::export_request::ExportRequest::from_json(a.request.as_deref()?);
                request.ok()?.summary_file
            }),
        };
        match self {
            Command::Export(a) | Command::Archive(archive::ArchiveCommand::Export(a)) => export(a),
            Command::Engine(a) => a.summary_file.clone(),
            Command::Restore(a) => a.summary_file.clone().or_else(|| {
                let request = larch_contract::restore_request::RestoreRequest::from_json(
                    a.request.as_deref()?,
                );
                request.ok()?.summary_file
            }),
            _ => None,
        }
    }

    /// Exits by the failure's reason (2: someone must act, 1: may clear by itself).
    fn classified(&self) -> bool {
        matches!(
            self,
            Command::Export(_)
                | Command::Archive(archive::ArchiveCommand::Export(_))
                | Command::Engine(_)
                | Command::Restore(_)
                | Command::Status(_)
                | Command::Logs(_)
                | Command::RunNow(_)
                | Command::Transform(_)
                | Command::Subset(_)
        )
    }
}

/// Runs the CLI and returns the process exit code: 0; for `larch export` (also as `larch
/// archive export`), `larch engine`, `larch restore`, `larch status` and `larch transform` the failure's (see [`crate::failure`]: 2 needs someone
/// to act, as for invalid arguments, which clap exits with); 1 for the other commands' errors.
pub fn main() -> i32 {
    larch_core::version::set(env!("LARCH_VERSION"));
    let cli = Cli::parse();
    let termination_file = cli.command.termination_file();
    let classified = cli.command.classified();
    let _ = LOG_SETTINGS.set(cli.log.clone());
    // Both ring (kube) and aws-lc-rs (the S3 SDK) are linked, so rustls cannot pick a process
    // default by itself: install ring for every Kubernetes client (the operator's, and the
    // Lease of a continuous export).
    let _ = rustls::crypto::ring::default_provider().install_default();
    if prints_a_result(&cli.command) {
        // `larch archive inspect | head`: end quietly when the reader goes away, as other
        // Unix tools do, instead of panicking on EPIPE. Sockets are unaffected (Rust sends
        // with MSG_NOSIGNAL).
        // SAFETY: called before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Archive(c) => archive::run(c).await,
            Command::Export(a) => export::run(*a).await,
            Command::Engine(a) => engine::run(a).await,
            Command::Restore(a) => restore::run(*a).await,
            Command::Crd => Ok(operator::crd()),
            Command::Status(a) => status::run(a).await,
            Command::Logs(a) => status::logs(a).await,
            Command::RunNow(a) => status::run_now(a).await,
            Command::Transform(c) => transform::run(c).await,
            Command::Subset(c) => subset::run(c).await,
            Command::Operator(args) => {
                init_tracing();
                operator::operator(args).await
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            let code = crate::failure::report(termination_file.as_deref(), &e);
            if classified { code } else { 1 }
        }
    }
}

/// The error and its causes in one line, each cause once: some errors (kube's configuration
/// inference, for one) already print their sources, which `{:#}` would print again.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        // A data error's server text is withheld here as in the termination message.
        let redacted = crate::failure::redacted(cause, crate::failure::redact);
        let text = redacted.clone().unwrap_or_else(|| cause.to_string());
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        if redacted.is_some() {
            break;
        }
    }
    out
}

/// The timeouts of the sessions a command opens on the source database (docs/postgres-source.md,
/// "Session limits"): a stuck statement, lock wait or idle transaction ends instead of holding
/// the primary.
#[derive(Args, Debug, Clone)]
pub struct SessionLimitArgs {
    /// `statement_timeout` of larch's catalog sessions on the source database (schema
    /// discovery, slots, the publication, TOAST look-ups): none of them should take long.
    #[arg(long, default_value = "1m", value_parser = duration_text)]
    pub statement_timeout: String,
    /// `lock_timeout` of every session larch opens on the source database: a lock it waits for
    /// longer fails instead of queueing the primary's writers behind it.
    #[arg(long, default_value = "10s", value_parser = duration_text)]
    pub lock_timeout: String,
    /// `idle_in_transaction_session_timeout` of larch's catalog sessions.
    #[arg(long, default_value = "1m", value_parser = duration_text)]
    pub idle_in_transaction_timeout: String,
}

impl SessionLimitArgs {
    /// The limits of sessions that hold no snapshot (the snapshot's age keeps its default).
    pub fn limits(&self) -> crate::source::postgres::SessionLimits {
        // The value parser accepted each flag: parsing again cannot fail.
        let parse = |s: &str| parse_duration_arg(s).unwrap_or_default();
        crate::source::postgres::SessionLimits {
            statement_timeout: parse(&self.statement_timeout),
            lock_timeout: parse(&self.lock_timeout),
            idle_in_transaction_timeout: parse(&self.idle_in_transaction_timeout),
            ..Default::default()
        }
    }
}

/// A duration flag, kept as written (a request carries it as text).
pub fn duration_text(s: &str) -> Result<String, String> {
    parse_duration_arg(s).map(|_| s.to_string())
}

/// The PostgreSQL connection, from a flag, a file or the environment.
#[derive(Args, Debug, Clone, Default)]
pub struct ConnectionArgs {
    /// PostgreSQL connection string (key=value or postgres:// URL). Prefer --connection-file or
    /// LARCH_PG_DSN: a command line is visible to other users of the machine.
    #[arg(long, conflicts_with = "connection_file")]
    pub connection: Option<String>,
    /// File holding the connection string (surrounding whitespace ignored).
    #[arg(long)]
    pub connection_file: Option<std::path::PathBuf>,
}

impl ConnectionArgs {
    /// The connection string from the flag, the file or `LARCH_PG_DSN`, never echoed.
    pub fn dsn(&self) -> anyhow::Result<String> {
        self.read_dsn()
            .map_err(|e| crate::failure::tag(crate::failure::Reason::InvalidConfig, e))
    }

    fn read_dsn(&self) -> anyhow::Result<String> {
        if let Some(c) = &self.connection {
            return Ok(c.clone());
        }
        if let Some(path) = &self.connection_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --connection-file {}", path.display()))?;
            let text = text.trim();
            if text.is_empty() {
                anyhow::bail!("--connection-file {} is empty", path.display());
            }
            return Ok(text.to_string());
        }
        match std::env::var("LARCH_PG_DSN") {
            Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
            _ => anyhow::bail!(
                "no PostgreSQL connection: pass --connection, --connection-file or set LARCH_PG_DSN"
            ),
        }
    }

    /// `larch export cleanup` with the same connection, as a command that can be pasted
    /// into the same shell, without the secret itself.
    pub fn cleanup_command(&self) -> crate::export::run::CleanupCommand {
        let (flags, note) = match (&self.connection_file, &self.connection) {
            (Some(f), _) => (format!(" --connection-file {}", f.display()), String::new()),
            (None, Some(_)) => (
                " --connection-file FILE".to_string(),
                " (FILE: a file holding the connection string this export was given with \
                 --connection, which is not repeated here)"
                    .to_string(),
            ),
            (None, None) => (
                String::new(),
                " (in a shell where LARCH_PG_DSN holds the same connection string)".to_string(),
            ),
        };
        crate::export::run::CleanupCommand {
            command: format!("larch export cleanup{flags}"),
            note,
        }
    }
}

/// `--owner`: who the slots and publications are for, recorded in a publication's comment
/// (one line, printable, at most 256 bytes).
pub fn parse_owner(s: &str) -> Result<String, String> {
    crate::source::postgres::ownership::check_owner(s).map(|()| s.to_string())
}

/// A positive duration flag (`30s`, `5m`, `1h30m`).
pub fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    crate::duration::parse_positive(s)
}

#[cfg(test)]
mod tests {
    /// A cause that its error's message already carries is printed once.
    #[test]
    fn each_cause_is_printed_once() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "reading the config: {}", self.0)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = anyhow::Error::new(Outer(std::io::Error::from_raw_os_error(2))).context("larch");
        assert_eq!(
            super::one_line(&e),
            "larch: reading the config: No such file or directory (os error 2)"
        );
        assert_eq!(format!("{e:#}").matches("os error 2").count(), 2);
    }
}
