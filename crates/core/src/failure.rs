//! Why a larch process failed, in words a machine reads: the termination message contract
//! between the pods (`larch export`, `larch export --follow`, `larch engine`) and the operator.
//!
//! Every error a pod's process ends with is written, as one JSON line
//! `{"reason": "TableNotFound", "error": "table public.missing does not exist"}`, to its
//! termination-message file (`--summary-file` of `larch export`, `--termination-log` of
//! `larch engine`), and the exit status follows the reason: 2 for a failure that needs someone
//! to act (a missing table, a wrong password, a bad configuration: a Job is not retried),
//! 1 for one that may clear by itself (a connection refused while the database restarts) or is
//! not classified, 3 for a lost Lease. The operator turns the reason into the custom
//! resource's conditions (docs/operator.md, "Why a pod failed").
//!
//! The reason comes from the error itself: a tag put where the error is made ([`tag`]), or an
//! error type that classifies itself ([`Classify`]). Each layer classifies its own types and
//! asks the layer below ([`Classifier`]: the runs' asks PostgreSQL's, which asks the
//! archive's), so nothing here knows a type of a layer above.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The stable `reason` of a failure. New reasons are added, never renamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The table (or its schema) does not exist: SQLSTATE 42P01, 3F000.
    TableNotFound,
    /// A configured key or index field is not a column: SQLSTATE 42703, the engine's check.
    ColumnNotFound,
    /// The database named in the connection string does not exist: 3D000.
    DatabaseNotFound,
    /// Wrong user name or password: 28P01, 28000.
    AuthenticationFailed,
    /// The user lacks a privilege (SELECT, REPLICATION, owning the table): 42501.
    PermissionDenied,
    /// The source database does not allow logical replication (`wal_level`).
    ReplicationNotEnabled,
    /// The database could not be reached or went away (class 08, 57P01-57P03, 53300, a
    /// refused or reset connection): transient.
    ConnectionFailed,
    /// Arguments, the engine configuration or a key prefix are wrong.
    InvalidConfig,
    /// The S3 bucket does not exist.
    BucketNotFound,
    /// The store refused the credentials or the request (S3 AccessDenied, a bad key).
    StorageAccessDenied,
    /// The store could not be reached or failed a request: transient.
    StorageUnavailable,
    /// A continuous export lost its Lease and stopped writing (W9): transient.
    LeaseLost,
    /// The kubelet killed the container for exceeding its memory limit (read by the operator
    /// from the container's state; a process never writes it).
    OutOfMemory,
    /// An engine source with `require_transformed` found an archive whose manifest records no
    /// masking transform, or one that leaves a served column uncovered (raw rows): it loads
    /// nothing.
    ArchiveNotTransformed,
    /// An export's leak check (`--leak-check`, `spec.transform.leakCheck`) found raw values of
    /// masked columns in the archive it wrote: the message counts them per column, never
    /// quoting one.
    LeakFound,
    /// An export with `--require-validated` (`spec.transform.requireValidated`) whose constraint
    /// preflight found constraints the transform can break: it exported nothing; the message
    /// names them (constraint and column names, never a value).
    ConstraintsAtRisk,
    /// Anything else: the message says what.
    Failed,
}

pub const EXIT_FAILED: i32 = 1;
pub const EXIT_PERMANENT: i32 = 2;
/// A continuous export that lost its Lease stops writing at once and exits with this (W9).
pub const EXIT_LEASE_LOST: i32 = 3;

/// Termination messages are cut at 4096 bytes by Kubernetes: keep the error well below.
const MAX_ERROR_BYTES: usize = 3072;

impl Reason {
    pub const ALL: [Reason; 17] = [
        Reason::TableNotFound,
        Reason::ColumnNotFound,
        Reason::DatabaseNotFound,
        Reason::AuthenticationFailed,
        Reason::PermissionDenied,
        Reason::ReplicationNotEnabled,
        Reason::ConnectionFailed,
        Reason::InvalidConfig,
        Reason::BucketNotFound,
        Reason::StorageAccessDenied,
        Reason::StorageUnavailable,
        Reason::LeaseLost,
        Reason::OutOfMemory,
        Reason::ArchiveNotTransformed,
        Reason::LeakFound,
        Reason::ConstraintsAtRisk,
        Reason::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TableNotFound => "TableNotFound",
            Reason::ColumnNotFound => "ColumnNotFound",
            Reason::DatabaseNotFound => "DatabaseNotFound",
            Reason::AuthenticationFailed => "AuthenticationFailed",
            Reason::PermissionDenied => "PermissionDenied",
            Reason::ReplicationNotEnabled => "ReplicationNotEnabled",
            Reason::ConnectionFailed => "ConnectionFailed",
            Reason::InvalidConfig => "InvalidConfig",
            Reason::BucketNotFound => "BucketNotFound",
            Reason::StorageAccessDenied => "StorageAccessDenied",
            Reason::StorageUnavailable => "StorageUnavailable",
            Reason::LeaseLost => "LeaseLost",
            Reason::OutOfMemory => "OutOfMemory",
            Reason::ArchiveNotTransformed => "ArchiveNotTransformed",
            Reason::LeakFound => "LeakFound",
            Reason::ConstraintsAtRisk => "ConstraintsAtRisk",
            Reason::Failed => "Failed",
        }
    }

    /// A reason by its name; an unknown name (a newer pod) is `Failed`.
    pub fn parse(name: &str) -> Reason {
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == name)
            .unwrap_or(Reason::Failed)
    }

    /// Clears by itself (the database or the store comes back, a Lease frees up): the
    /// operator reports it as `Degraded`; everything else needs someone to act (`Stalled`).
    pub fn transient(self) -> bool {
        matches!(
            self,
            Reason::ConnectionFailed | Reason::StorageUnavailable | Reason::LeaseLost
        )
    }

    pub fn exit_code(self) -> i32 {
        match self {
            Reason::LeaseLost => EXIT_LEASE_LOST,
            Reason::Failed => EXIT_FAILED,
            r if r.transient() => EXIT_FAILED,
            _ => EXIT_PERMANENT,
        }
    }

    /// The reason of a PostgreSQL SQLSTATE, if it is one larch names.
    pub fn of_sqlstate(code: &str) -> Option<Reason> {
        Some(match code {
            "42P01" | "3F000" => Reason::TableNotFound,
            "42703" => Reason::ColumnNotFound,
            "3D000" => Reason::DatabaseNotFound,
            "28P01" | "28000" => Reason::AuthenticationFailed,
            "42501" => Reason::PermissionDenied,
            // admin_shutdown, crash_shutdown, cannot_connect_now (starting up),
            // too_many_connections: the server restarts or is busy.
            "57P01" | "57P02" | "57P03" | "53300" => Reason::ConnectionFailed,
            c if c.starts_with("08") => Reason::ConnectionFailed,
            _ => return None,
        })
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error carrying its reason. Displays as the error it wraps, so tagging changes no
/// message.
#[derive(Debug)]
pub struct Tagged {
    pub reason: Reason,
    inner: anyhow::Error,
}

impl fmt::Display for Tagged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for Tagged {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

/// `err` with `reason`, for errors whose cause is known where they are made.
pub fn tag(reason: Reason, err: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Tagged {
        reason,
        inner: err.into(),
    })
}

/// `return Err(tag(reason, anyhow!(...)))`.
#[macro_export]
macro_rules! bail_tagged {
    ($reason:expr, $($arg:tt)+) => {
        return Err($crate::failure::tag($reason, anyhow::anyhow!($($arg)+)))
    };
}
pub use crate::bail_tagged as bail;

/// An error type that knows why it happened (a missing bucket, a bad configuration).
pub trait Classify: std::error::Error + 'static {
    /// The reason, when this error names one.
    fn reason(&self) -> Option<Reason>;
}

/// A layer's look at one cause of an error chain: the reason if the cause is one of the
/// layer's own types (or of the layers below it).
pub type Classifier = fn(&(dyn std::error::Error + 'static)) -> Option<Reason>;

/// The reason of `cause` if it is an `E`.
pub fn reason_if<E: Classify>(cause: &(dyn std::error::Error + 'static)) -> Option<Reason> {
    cause.downcast_ref::<E>().and_then(Classify::reason)
}

/// Why `err` happened: the outermost tag, else the first cause `layer` (or an I/O error's
/// kind) names, else a SQLSTATE in the text, else [`Reason::Failed`].
pub fn classify_with(err: &anyhow::Error, layer: Classifier) -> Reason {
    for cause in err.chain() {
        if let Some(t) = cause.downcast_ref::<Tagged>() {
            return t.reason;
        }
        if let Some(reason) = layer(cause).or_else(|| of_io(cause)) {
            return reason;
        }
    }
    sqlstate_in(&format!("{err:#}"))
        .and_then(Reason::of_sqlstate)
        .unwrap_or(Reason::Failed)
}

/// [`classify_with`] knowing only tags, I/O errors and SQLSTATEs in the text.
pub fn classify(err: &anyhow::Error) -> Reason {
    classify_with(err, |_| None)
}

fn of_io(cause: &(dyn std::error::Error + 'static)) -> Option<Reason> {
    use std::io::ErrorKind as K;
    let io = cause.downcast_ref::<std::io::Error>()?;
    matches!(
        io.kind(),
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::TimedOut
            | K::BrokenPipe
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::AddrNotAvailable
    )
    .then_some(Reason::ConnectionFailed)
}

/// `err` tagged with `reason` when there is one.
pub fn tag_opt(reason: Option<Reason>, err: anyhow::Error) -> anyhow::Error {
    match reason {
        Some(r) => tag(r, err),
        None => err,
    }
}

/// The first `SQLSTATE xxxxx` in `text` (how the replication protocol's errors carry it).
pub fn sqlstate_in(text: &str) -> Option<&str> {
    let at = text.find("SQLSTATE ")? + "SQLSTATE ".len();
    let code = text.get(at..at + 5)?;
    code.bytes()
        .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        .then_some(code)
}

/// The termination message of a failed process.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TerminationMessage {
    pub reason: String,
    pub error: String,
}

impl TerminationMessage {
    pub fn of(reason: Reason, err: &anyhow::Error) -> TerminationMessage {
        Self::with_text(reason, &format!("{err:#}"))
    }

    /// The message of `reason` with `text` as its error (cut to fit).
    pub fn with_text(reason: Reason, text: &str) -> TerminationMessage {
        TerminationMessage {
            reason: reason.as_str().into(),
            error: truncate(text, MAX_ERROR_BYTES),
        }
    }

    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("strings serialise")
    }

    /// The last line of `text` that is a termination message (a process may print more).
    pub fn parse(text: &str) -> Option<TerminationMessage> {
        text.lines()
            .rev()
            .find_map(|l| serde_json::from_str::<TerminationMessage>(l.trim()).ok())
    }

    pub fn reason(&self) -> Reason {
        Reason::parse(&self.reason)
    }
}

/// A layer's own words for one cause of an error chain whose text must not leave the process
/// as it is (a database server's message that may quote a row's values): `Some(text)` stands
/// for that cause and every cause under it. Like [`Classifier`], each layer's asks the one
/// below.
pub type Redactor = fn(&(dyn std::error::Error + 'static)) -> Option<String>;

/// What `redact` says of `cause`; a [`Tagged`] error is looked through (it displays the error
/// it wraps).
pub fn redacted(cause: &(dyn std::error::Error + 'static), redact: Redactor) -> Option<String> {
    match cause.downcast_ref::<Tagged>() {
        Some(t) => {
            let inner: &(dyn std::error::Error + 'static) = t.inner.as_ref();
            redact(inner)
        }
        None => redact(cause),
    }
}

/// `err` as `{err:#}` writes it (`outer: cause: …`), each cause as `redact` says.
pub fn render(err: &anyhow::Error, redact: Redactor) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        if !out.is_empty() {
            out.push_str(": ");
        }
        if let Some(text) = redacted(cause, redact) {
            out.push_str(&text);
            break;
        }
        out.push_str(&cause.to_string());
    }
    out
}

/// Writes the termination message of `err`, classified by `layer` and its text rendered through
/// `redact`, to `path` (best effort: a failure to write is printed, the exit status still
/// tells). Returns the exit status for `err`.
pub fn report_with(
    path: Option<&Path>,
    err: &anyhow::Error,
    layer: Classifier,
    redact: Redactor,
) -> i32 {
    let message = TerminationMessage::with_text(classify_with(err, layer), &render(err, redact));
    if let Some(path) = path
        && let Err(e) = std::fs::write(path, format!("{}\n", message.to_line()))
    {
        eprintln!(
            "could not write the termination message to {}: {e}",
            path.display()
        );
    }
    message.reason().exit_code()
}

/// `s` cut to at most `max` bytes, at a character boundary, marked when cut.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn sqlstates_name_their_reasons() {
        let cases = [
            ("42P01", Some(Reason::TableNotFound)),
            ("3F000", Some(Reason::TableNotFound)),
            ("42703", Some(Reason::ColumnNotFound)),
            ("42501", Some(Reason::PermissionDenied)),
            ("28P01", Some(Reason::AuthenticationFailed)),
            ("28000", Some(Reason::AuthenticationFailed)),
            ("3D000", Some(Reason::DatabaseNotFound)),
            ("08006", Some(Reason::ConnectionFailed)),
            ("08001", Some(Reason::ConnectionFailed)),
            ("57P01", Some(Reason::ConnectionFailed)),
            ("57P03", Some(Reason::ConnectionFailed)),
            ("53300", Some(Reason::ConnectionFailed)),
            ("23505", None),
            ("55000", None),
        ];
        for (code, want) in cases {
            assert_eq!(Reason::of_sqlstate(code), want, "{code}");
        }
    }

    #[test]
    fn names_round_trip_and_exit_codes_follow_permanence() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), r);
        }
        assert_eq!(Reason::parse("SomethingNewer"), Reason::Failed);
        assert_eq!(Reason::TableNotFound.exit_code(), 2);
        assert_eq!(Reason::InvalidConfig.exit_code(), 2);
        assert_eq!(Reason::ConstraintsAtRisk.exit_code(), 2);
        assert_eq!(Reason::ConnectionFailed.exit_code(), 1);
        assert_eq!(Reason::Failed.exit_code(), 1);
        assert_eq!(Reason::LeaseLost.exit_code(), 3);
        assert!(Reason::ConnectionFailed.transient() && !Reason::PermissionDenied.transient());
        assert!(
            !Reason::Failed.transient(),
            "unclassified: someone must look"
        );
    }

    #[test]
    fn a_tag_survives_context_and_changes_no_message() {
        let e = tag(
            Reason::TableNotFound,
            anyhow!("table public.x does not exist"),
        )
        .context("discovering tables");
        assert_eq!(classify(&e), Reason::TableNotFound);
        assert_eq!(
            format!("{e:#}"),
            "discovering tables: table public.x does not exist"
        );
        // The outermost tag wins.
        let outer = tag(Reason::InvalidConfig, tag(Reason::Failed, anyhow!("x")));
        assert_eq!(classify(&outer), Reason::InvalidConfig);
    }

    #[test]
    fn render_replaces_a_redacted_cause_and_what_is_under_it() {
        #[derive(Debug)]
        struct Quoting;
        impl fmt::Display for Quoting {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("invalid input: \"alice@corp.example\"")
            }
        }
        impl std::error::Error for Quoting {}
        let redact: Redactor = |c| c.downcast_ref::<Quoting>().map(|_| "withheld".to_string());
        let e = anyhow::Error::new(Quoting).context("copying table public.users");
        assert_eq!(render(&e, redact), "copying table public.users: withheld");
        // A tag displays what it wraps: it is looked through.
        let tagged = tag(Reason::Failed, Quoting).context("outer");
        assert_eq!(render(&tagged, redact), "outer: withheld");
        // Without anything to redact, the text is `{:#}`'s.
        let plain = anyhow!("inner").context("middle").context("outer");
        assert_eq!(render(&plain, redact), format!("{plain:#}"));
    }

    #[test]
    fn io_causes_and_text_are_classified() {
        let refused =
            anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                .context("connecting");
        assert_eq!(classify(&refused), Reason::ConnectionFailed);
        let missing_file = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(classify(&missing_file), Reason::Failed);
        let text = anyhow!("START_REPLICATION: database \"gone\" does not exist (SQLSTATE 3D000)");
        assert_eq!(classify(&text), Reason::DatabaseNotFound);
        assert_eq!(classify(&anyhow!("something odd")), Reason::Failed);
    }

    #[test]
    fn the_message_is_one_json_line_and_parses_back() {
        let e = tag(Reason::InvalidConfig, anyhow!("line one\nline \"two\""));
        let m = TerminationMessage::of(classify(&e), &e);
        let line = m.to_line();
        assert!(!line.contains('\n'), "{line}");
        let parsed = TerminationMessage::parse(&format!("noise\n{line}\n")).unwrap();
        assert_eq!(parsed, m);
        assert_eq!(parsed.reason(), Reason::InvalidConfig);
        assert_eq!(parsed.error, "line one\nline \"two\"");
        assert_eq!(TerminationMessage::parse("{\"table\": \"x\"}"), None);

        let long = anyhow!("é{}", "x".repeat(5000));
        let cut = TerminationMessage::of(Reason::Failed, &long).error;
        assert!(cut.len() <= MAX_ERROR_BYTES + 3 && cut.ends_with('…'));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("termination-log");
        let code = report_with(Some(&path), &e, |_| None, |_| None);
        assert_eq!(code, 2);
        let written = std::fs::read_to_string(&path).unwrap();
        assert_eq!(TerminationMessage::parse(&written), Some(m));
    }
}
