//! What larch leaves on the source database, and removing it: the replication slot's WAL
//! figures, the ownership record, and `larch export cleanup`.
//!
//! Ownership is recorded, never guessed ([`crate::ownership`]): cleanup drops a slot and its
//! publication only when the publication's record names that slot and the caller's owner; the
//! slot goes first, so a failure half-way leaves the record for the next attempt.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio_postgres::Client;

use super::config::{PostgresConfig, ident, literal};
use super::ownership::{self, publication};
use super::schema::{self, db_error};

/// What `pg_replication_slots` says about a slot, with its WAL figures in bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SlotUsage {
    pub slot: String,
    pub temporary: bool,
    pub active_pid: Option<i32>,
    pub database: Option<String>,
    /// `reserved`, `extended`, `unreserved` (lost at the next checkpoint) or `lost`.
    pub wal_status: Option<String>,
    pub restart_lsn: Option<String>,
    pub confirmed_flush_lsn: Option<String>,
    /// WAL the server keeps for this slot: `pg_current_wal_lsn() - restart_lsn`.
    pub retained_bytes: Option<u64>,
    /// What the consumer has not confirmed: `pg_current_wal_lsn() - confirmed_flush_lsn`
    /// (laredo's `laredo_source_lag_bytes`).
    pub lag_bytes: Option<u64>,
    /// Bytes left before `max_slot_wal_keep_size` invalidates the slot (`None`: no limit).
    pub safe_wal_size: Option<i64>,
}

impl SlotUsage {
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

/// The slot's usage, `None` when it does not exist.
pub async fn slot_usage(client: &Client, slot: &str) -> anyhow::Result<Option<SlotUsage>> {
    let row = client
        .query_opt(
            "SELECT temporary, active_pid, database::text, wal_status, restart_lsn::text,
                    confirmed_flush_lsn::text,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8,
                    safe_wal_size::int8
               FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .with_context(|| format!("looking up replication slot {slot}"))?;
    let bytes = |v: Option<i64>| v.map(|b| b.max(0) as u64);
    Ok(row.map(|r| SlotUsage {
        slot: slot.to_string(),
        temporary: r.get(0),
        active_pid: r.get(1),
        database: r.get(2),
        wal_status: r.get(3),
        restart_lsn: r.get(4),
        confirmed_flush_lsn: r.get(5),
        retained_bytes: bytes(r.get(6)),
        lag_bytes: bytes(r.get(7)),
        safe_wal_size: r.get(8),
    }))
}

/// Drops `publication` when its record names `slot` and `owner` and no persistent slot of
/// that name is left to stream through it (the slot is gone, or a temporary one on its way
/// out). Returns whether it dropped it.
pub async fn drop_publication_of_gone_slot(
    client: &Client,
    publication_name: &str,
    slot: &str,
    owner: &str,
) -> anyhow::Result<bool> {
    let Some(p) = publication(client, publication_name).await? else {
        return Ok(false);
    };
    if ownership::check(Some(&p), publication_name, slot, owner, false).is_err() {
        return Ok(false);
    }
    if slot_usage(client, slot)
        .await?
        .is_some_and(|s| !s.temporary)
    {
        return Ok(false);
    }
    drop_publication(client, publication_name).await?;
    Ok(true)
}

async fn drop_publication(client: &Client, name: &str) -> anyhow::Result<()> {
    client
        .batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", ident(name)))
        .await
        .map_err(|e| db_error(format!("dropping publication {name}"), &e))
}

/// One object cleanup looked at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CleanedObject {
    /// `slot` or `publication`.
    pub kind: &'static str,
    pub name: String,
    /// `dropped`, `absent` (nothing to do) or `kept` (not larch's).
    pub outcome: &'static str,
    /// Why it was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What `larch export cleanup` did, on which server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    pub server: String,
    pub objects: Vec<CleanedObject>,
}

impl CleanupReport {
    pub fn kept(&self) -> impl Iterator<Item = &CleanedObject> {
        self.objects.iter().filter(|o| o.outcome == "kept")
    }
}

/// Drops the slot and publication of each `(slot, publication)` pair recorded as
/// `config.owner`'s (see [`crate::ownership`]; `adopt_legacy`: also a record an older larch
/// wrote without an owner); anything else is reported as kept with the reason. A slot in use
/// waits up to `wait` for its session to end (an exporter being stopped), then fails. Errors
/// name the server, never the credentials.
pub async fn cleanup(
    config: &PostgresConfig,
    pairs: &[(String, String)],
    wait: Duration,
    adopt_legacy: bool,
) -> anyhow::Result<CleanupReport> {
    let client = schema::connect(config).await?;
    let db: String = client
        .query_one("SELECT current_database()::text", &[])
        .await
        .context("reading the current database")?
        .get(0);
    let mut objects = Vec::new();
    for (slot, publication_name) in pairs {
        let record = publication(&client, publication_name).await?;
        let owned = ownership::check(
            record.as_ref(),
            publication_name,
            slot,
            &config.owner,
            adopt_legacy,
        );
        objects.push(cleanup_slot(&client, &db, slot, &owned, wait).await?);
        objects.push(match (&record, owned) {
            (None, _) => absent("publication", publication_name),
            (Some(_), Ok(())) => {
                drop_publication(&client, publication_name).await?;
                dropped("publication", publication_name)
            }
            (Some(_), Err(why)) => kept("publication", publication_name, why),
        });
    }
    Ok(CleanupReport {
        server: config.describe(),
        objects,
    })
}

async fn cleanup_slot(
    client: &Client,
    db: &str,
    slot: &str,
    owned: &Result<(), String>,
    wait: Duration,
) -> anyhow::Result<CleanedObject> {
    let Some(mut usage) = slot_usage(client, slot).await? else {
        return Ok(absent("slot", slot));
    };
    if usage.database.as_deref() != Some(db) {
        return Ok(kept(
            "slot",
            slot,
            format!(
                "belongs to database {:?}, not {db:?}",
                usage.database.as_deref().unwrap_or("")
            ),
        ));
    }
    if let Err(why) = owned {
        return Ok(kept(
            "slot",
            slot,
            format!(
                "{why}; drop it yourself if it is unused: SELECT pg_drop_replication_slot({})",
                literal(slot)
            ),
        ));
    }
    let deadline = Instant::now() + wait;
    while let Some(pid) = usage.active_pid {
        if Instant::now() >= deadline {
            anyhow::bail!(
                "replication slot {slot} is in use by PID {pid} (is an exporter still running?); \
                 stop it and run the cleanup again"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        match slot_usage(client, slot).await? {
            Some(u) => usage = u,
            // A temporary slot whose session ended.
            None => return Ok(absent("slot", slot)),
        }
    }
    match client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
    {
        Ok(_) => Ok(dropped("slot", slot)),
        Err(e) if e.as_db_error().is_some_and(|d| d.code().code() == "42704") => {
            Ok(absent("slot", slot))
        }
        Err(e) => Err(db_error(format!("dropping replication slot {slot}"), &e)),
    }
}

fn dropped(kind: &'static str, name: &str) -> CleanedObject {
    CleanedObject {
        kind,
        name: name.into(),
        outcome: "dropped",
        reason: None,
    }
}

fn absent(kind: &'static str, name: &str) -> CleanedObject {
    CleanedObject {
        kind,
        name: name.into(),
        outcome: "absent",
        reason: None,
    }
}

fn kept(kind: &'static str, name: &str, reason: String) -> CleanedObject {
    CleanedObject {
        kind,
        name: name.into(),
        outcome: "kept",
        reason: Some(reason),
    }
}

/// Reads slots' usage over one query connection, reconnecting after a failure.
pub struct SlotWatcher {
    config: PostgresConfig,
    client: Option<Client>,
}

impl SlotWatcher {
    pub fn new(config: PostgresConfig) -> SlotWatcher {
        SlotWatcher {
            config,
            client: None,
        }
    }

    pub fn server(&self) -> String {
        self.config.describe()
    }

    /// Each slot's usage (`None`: the slot does not exist).
    pub async fn read(
        &mut self,
        slots: &[String],
    ) -> anyhow::Result<Vec<(String, Option<SlotUsage>)>> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.client = Some(schema::connect(&self.config).await?);
        }
        let client = self.client.as_ref().expect("connected");
        let mut out = Vec::with_capacity(slots.len());
        for slot in slots {
            match slot_usage(client, slot).await {
                Ok(u) => out.push((slot.clone(), u)),
                Err(e) => {
                    self.client = None;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }
}
