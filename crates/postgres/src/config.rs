//! Configuration of the PostgreSQL source and its two kinds of connection: an ordinary one
//! (tokio-postgres: schema discovery, COPY, slot inspection) and a replication one
//! (pgwire-replication: slot creation and the pgoutput stream). The DSN holds credentials: it
//! is never logged or printed, and errors name only host, port, database and user.

use std::fmt;
use std::time::Duration;

use anyhow::Context;
use tokio_postgres::config::Host;

use larch_archive::model::TableId;

/// Session settings pinned on both connections so that text output (and therefore the JSON
/// mapping) does not depend on server or role defaults. `standard_conforming_strings=on` makes
/// the server read backslashes in string literals as the row filter's parser did
/// ([`crate::row_filter`]).
pub const SESSION_OPTIONS: &str = "-c DateStyle=ISO -c TimeZone=UTC -c IntervalStyle=iso_8601 \
     -c extra_float_digits=1 -c bytea_output=hex -c client_encoding=UTF8 \
     -c standard_conforming_strings=on";

/// The kinds of session larch opens on a source database; each gets its own timeouts
/// ([`SessionLimits`]), set as startup options so they hold from the first statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Session {
    /// Schema discovery, slot and publication management, TOAST look-ups, lag: short
    /// statements.
    Catalog,
    /// A baseline's snapshot transaction (its COPY, and the coordinator that keeps a shared
    /// snapshot open while the tables are copied): it may legitimately last hours, so it is
    /// bounded by the snapshot's total age instead.
    Snapshot,
    /// A replication session (slot creation, the pgoutput stream): the stream is one command
    /// that runs as long as the export, so its `statement_timeout` is 0, set explicitly so a
    /// role's or database's default cannot cut it.
    Replication,
}

/// Timeouts of the sessions larch opens on a source database, so that nothing it runs holds
/// locks, a snapshot (and with it the primary's xmin horizon) or a backend indefinitely.
/// Also `larch export --statement-timeout`, `--lock-timeout`, `--idle-in-transaction-timeout`,
/// `--snapshot-max-age` (docs/postgres-source.md, "Session limits").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// `statement_timeout` of catalog sessions.
    pub statement_timeout: Duration,
    /// `lock_timeout` of every session: a lock larch waits for longer fails instead of
    /// queueing the primary's writers behind it.
    pub lock_timeout: Duration,
    /// `idle_in_transaction_session_timeout` of catalog sessions.
    pub idle_in_transaction_timeout: Duration,
    /// The longest a baseline's snapshot stays open, from the slot's creation to the last
    /// COPY's end: each COPY's `statement_timeout` is what is left of it, and it is the
    /// `idle_in_transaction_session_timeout` of the snapshot and replication sessions (the
    /// slot's session holds the exported snapshot in an open transaction).
    pub snapshot_max_age: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            statement_timeout: Duration::from_secs(60),
            lock_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(60),
            snapshot_max_age: Duration::from_secs(24 * 3600),
        }
    }
}

/// A duration as PostgreSQL's integer milliseconds (0 would mean "no limit": at least 1).
pub fn millis(d: Duration) -> u128 {
    d.as_millis().max(1)
}

impl SessionLimits {
    /// The startup options (`-c name=value`) of a session of kind `session`.
    pub fn options(&self, session: Session) -> String {
        let (statement, lock, idle) = match session {
            Session::Catalog => (
                millis(self.statement_timeout),
                millis(self.lock_timeout),
                millis(self.idle_in_transaction_timeout),
            ),
            Session::Snapshot => (
                millis(self.snapshot_max_age),
                millis(self.lock_timeout),
                millis(self.snapshot_max_age),
            ),
            // The slot's session keeps its exported snapshot in an open transaction while the
            // baseline copies: the snapshot's age bounds it. Its only lock wait is the slot's
            // creation waiting for the write transactions running on the primary to end, which
            // queues no writer: the snapshot's age bounds that too, not `lock_timeout` (a batch
            // job's transaction longer than it would fail every export started meanwhile).
            Session::Replication => (
                0,
                millis(self.snapshot_max_age),
                millis(self.snapshot_max_age),
            ),
        };
        format!(
            "-c statement_timeout={statement} -c lock_timeout={lock} \
             -c idle_in_transaction_session_timeout={idle}"
        )
    }
}

/// Also `--slot-mode persistent|temporary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SlotMode {
    /// The slot survives restarts; a restarted source resumes from its confirmed position.
    Persistent,
    /// The slot lives as long as the replication session (dropped by PostgreSQL when it ends).
    Temporary,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Reconnect {
    /// Attempts in a row before the stream fails (0 = retry forever).
    pub max_attempts: u32,
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
}

impl Default for Reconnect {
    fn default() -> Self {
        Reconnect {
            max_attempts: 10,
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            multiplier: 2.0,
        }
    }
}

#[derive(Clone)]
pub struct PostgresConfig {
    /// libpq key=value string or `postgres://` URL. Never logged.
    pub dsn: String,
    pub tables: Vec<TableId>,
    /// Key fields when the tables have no primary key (applies to every table); empty = PK.
    pub key_fields: Vec<String>,
    pub slot_name: String,
    pub publication_name: String,
    /// Who the slot and publication are created for, recorded in the publication's comment:
    /// only the same owner drops them ([`crate::ownership`]).
    pub owner: String,
    pub slot_mode: SlotMode,
    /// Create the publication (`FOR TABLE …`) when it is absent. An existing publication is
    /// never rewritten unless larch created it for this slot.
    pub create_publication: bool,
    /// A baseline only, never a stream (a one-shot export): no publication is needed, so none
    /// is created or checked.
    pub snapshot_only: bool,
    /// A baseline's row filter per table (an SQL predicate, checked by
    /// [`super::snapshot::check_row_filter`]): the COPY reads only the rows it keeps. Only for
    /// a snapshot-only source (a stream would not respect it).
    pub row_filters: std::collections::BTreeMap<TableId, String>,
    /// What the row filters' subqueries may read; None: no subquery (the default).
    pub row_filter_subqueries: Option<crate::row_filter::SubqueryTables>,
    pub reconnect: Reconnect,
    /// How often acknowledged positions reach the server at most.
    pub status_interval: Duration,
    pub connect_timeout: Duration,
    /// Timeouts of every session larch opens ([`SessionLimits`]).
    pub limits: SessionLimits,
}

impl PostgresConfig {
    /// A config with larch's defaults: persistent slot, publication created when absent.
    pub fn new(
        dsn: impl Into<String>,
        tables: Vec<TableId>,
        slot_name: impl Into<String>,
        publication_name: impl Into<String>,
    ) -> PostgresConfig {
        PostgresConfig {
            dsn: dsn.into(),
            tables,
            key_fields: Vec::new(),
            slot_name: slot_name.into(),
            publication_name: publication_name.into(),
            owner: crate::ownership::DEFAULT_OWNER.to_string(),
            slot_mode: SlotMode::Persistent,
            create_publication: true,
            snapshot_only: false,
            row_filters: Default::default(),
            row_filter_subqueries: None,
            reconnect: Reconnect::default(),
            status_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            limits: SessionLimits::default(),
        }
    }

    /// The conventional slot/publication name for one table: `larch_<schema>_<table>`, lower
    /// case, anything outside `[a-z0-9_]` replaced by `_`, at most 63 bytes. A hash of the exact
    /// `schema.table` is added whenever the plain name could stand for another table: a name
    /// changed by the mapping, one cut to fit, or a schema with a `_` (`a_b.c` and `a.b_c`).
    pub fn default_name(table: &TableId) -> String {
        let plain = format!("larch_{}_{}", table.schema, table.table);
        let mut name: String = plain
            .chars()
            .map(|c| {
                let c = c.to_ascii_lowercase();
                if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if name.len() > 63 || name != plain || table.schema.contains('_') {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(format!("{}.{}", table.schema, table.table));
            let suffix = hex::encode(&digest[..4]);
            name.truncate(63 - 9);
            name.push('_');
            name.push_str(&suffix);
        }
        name
    }

    pub(crate) fn parsed(&self) -> anyhow::Result<tokio_postgres::Config> {
        Ok(self.dsn()?.config)
    }

    /// The connection string with its TLS settings and larch's session defaults, for a
    /// catalog session. The parser's messages never include the password; the DSN itself is
    /// not repeated.
    pub(crate) fn dsn(&self) -> anyhow::Result<crate::connection::PgDsn> {
        self.dsn_for(Session::Catalog)
    }

    /// [`Self::dsn`] for a session of kind `session`: larch's settings and that kind's
    /// timeouts come after the connection string's own `options`, so they win.
    pub(crate) fn dsn_for(&self, session: Session) -> anyhow::Result<crate::connection::PgDsn> {
        let mut dsn = crate::connection::PgDsn::parse(&self.dsn)?;
        let cfg = &mut dsn.config;
        let ours = format!("{SESSION_OPTIONS} {}", self.limits.options(session));
        let options = match cfg.get_options() {
            Some(o) if !o.trim().is_empty() => format!("{o} {ours}"),
            _ => ours,
        };
        cfg.options(options);
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(self.connect_timeout);
        }
        if cfg.get_application_name().is_none() {
            cfg.application_name("larch");
        }
        if cfg.get_user().is_none() {
            cfg.user(std::env::var("PGUSER").unwrap_or_else(|_| "postgres".into()));
        }
        Ok(dsn)
    }

    /// `host:port/database as user`, with no credentials, for error messages.
    pub fn describe(&self) -> String {
        match self.parsed() {
            Ok(cfg) => describe(&cfg),
            Err(_) => "<invalid connection string>".to_string(),
        }
    }

    /// Settings for a replication session on this DSN.
    pub(crate) fn replication(
        &self,
        start: u64,
        ack: Option<u64>,
    ) -> anyhow::Result<pgwire_replication::ReplicationConfig> {
        let dsn = self.dsn_for(Session::Replication)?;
        let cfg = &dsn.config;
        let host = match cfg.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.to_string_lossy().into_owned(),
            None => "localhost".to_string(),
        };
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        let user = cfg.get_user().unwrap_or("postgres").to_string();
        let password = match cfg.get_password() {
            Some(p) => String::from_utf8(p.to_vec()).context("the password is not UTF-8")?,
            None => std::env::var("PGPASSWORD").unwrap_or_default(),
        };
        let database = cfg.get_dbname().unwrap_or(&user).to_string();
        let mut rc = pgwire_replication::ReplicationConfig::new(
            host,
            user,
            password,
            database,
            self.slot_name.clone(),
            self.publication_name.clone(),
        )
        .with_port(port)
        .with_tls(dsn.replication_tls())
        .with_start_lsn(pgwire_replication::Lsn(start))
        .with_status_interval(self.status_interval)
        .with_wakeup_interval(Duration::from_secs(5))
        .with_buffer_size(1024)
        .with_options(cfg.get_options().unwrap_or(SESSION_OPTIONS).to_string())
        .with_application_name(format!("larch:{}", self.slot_name));
        if let Some(ack) = ack {
            rc = rc.with_ack_lsn(pgwire_replication::Lsn(ack));
        }
        Ok(rc)
    }
}

pub(crate) fn describe(cfg: &tokio_postgres::Config) -> String {
    let host = match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.to_string_lossy().into_owned(),
        None => "localhost".to_string(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres");
    let db = cfg.get_dbname().unwrap_or(user);
    format!("{host}:{port}/{db} as user {user}")
}

/// The DSN is secret: Debug shows everything else.
impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("dsn", &"<redacted>")
            .field("server", &self.describe())
            .field("tables", &self.tables)
            .field("key_fields", &self.key_fields)
            .field("slot_name", &self.slot_name)
            .field("publication_name", &self.publication_name)
            .field("owner", &self.owner)
            .field("slot_mode", &self.slot_mode)
            .field("create_publication", &self.create_publication)
            .field("snapshot_only", &self.snapshot_only)
            .field("row_filters", &self.row_filters)
            .field("row_filter_subqueries", &self.row_filter_subqueries)
            .field("reconnect", &self.reconnect)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Quotes an SQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes an SQL string literal.
pub fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

pub fn qualified(table: &TableId) -> String {
    format!("{}.{}", ident(&table.schema), ident(&table.table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_session_kind_sets_its_timeouts() {
        let limits = SessionLimits {
            statement_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_millis(1500),
            idle_in_transaction_timeout: Duration::from_secs(30),
            snapshot_max_age: Duration::from_secs(3600),
        };
        assert_eq!(
            limits.options(Session::Catalog),
            "-c statement_timeout=5000 -c lock_timeout=1500 -c idle_in_transaction_session_timeout=30000"
        );
        assert_eq!(
            limits.options(Session::Snapshot),
            "-c statement_timeout=3600000 -c lock_timeout=1500 -c idle_in_transaction_session_timeout=3600000"
        );
        assert_eq!(
            limits.options(Session::Replication),
            "-c statement_timeout=0 -c lock_timeout=3600000 -c idle_in_transaction_session_timeout=3600000"
        );
        // larch's settings come after the connection string's own, so they win.
        let mut c = PostgresConfig::new(
            "host=db user=u options='-c statement_timeout=0'",
            vec![],
            "s",
            "p",
        );
        c.limits = limits;
        let options = c.dsn().unwrap().config.get_options().unwrap().to_string();
        assert!(
            options.starts_with("-c statement_timeout=0 -c DateStyle=ISO")
                && options.ends_with("-c statement_timeout=5000 -c lock_timeout=1500 -c idle_in_transaction_session_timeout=30000")
                && options.contains("standard_conforming_strings=on"),
            "{options}"
        );
        let replication = c.replication(0, None).unwrap();
        assert!(format!("{replication:?}").contains("statement_timeout=0 -c lock_timeout=3600000"));
    }

    #[test]
    fn debug_never_shows_the_password() {
        let c = PostgresConfig::new(
            "postgres://alice:s3cret@db.example:6543/app",
            vec![],
            "s",
            "p",
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("db.example:6543/app as user alice"),
            "{shown}"
        );
        let rc = c.replication(0, None).unwrap();
        assert_eq!(
            (rc.host.as_str(), rc.port, rc.password.as_str()),
            ("db.example", 6543, "s3cret")
        );
    }

    #[test]
    fn default_names() {
        assert_eq!(
            PostgresConfig::default_name(&TableId::new("public", "orders")),
            "larch_public_orders"
        );
        let a = PostgresConfig::default_name(&TableId::new("public", "Orders"));
        let b = PostgresConfig::default_name(&TableId::new("public", "orders!"));
        assert!(a.starts_with("larch_public_orders_") && b.starts_with("larch_public_orders_"));
        assert_ne!(a, b);
        let long = PostgresConfig::default_name(&TableId::new("s", "x".repeat(100)));
        assert!(long.len() <= 63);
        // `larch_a_b_c` could be a_b.c or a.b_c: they get distinct, stable names.
        let ab_c = PostgresConfig::default_name(&TableId::new("a_b", "c"));
        let a_bc = PostgresConfig::default_name(&TableId::new("a", "b_c"));
        assert_eq!(a_bc, "larch_a_b_c");
        assert_ne!(ab_c, a_bc);
        assert_eq!(
            ab_c,
            PostgresConfig::default_name(&TableId::new("a_b", "c"))
        );
        assert!(
            ab_c.starts_with("larch_a_b_c_") && ab_c.len() <= 63,
            "{ab_c}"
        );
    }
}
