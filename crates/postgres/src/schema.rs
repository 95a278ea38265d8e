//! Connection checks, schema discovery, type resolution and the publication.

use std::collections::{BTreeSet, HashMap};

use anyhow::{Context, anyhow, bail};
use tokio_postgres::Client;

use super::config::{PostgresConfig, Session, describe, ident, literal, qualified};
use super::ownership::{OwnerRecord, owner_comment};
use super::types::Kind;
use larch_archive::model::{ColumnDefinition, TableId, effective_key_fields};
use larch_core::failure::{self, Reason};

/// A discovered table.
#[derive(Clone, Debug)]
pub struct TableSchema {
    pub id: TableId,
    pub columns: Vec<ColumnDefinition>,
    /// Per column (same order): type oid, `atttypmod` and `format_type(atttypid, atttypmod)`.
    pub type_oids: Vec<u32>,
    pub type_mods: Vec<i32>,
    pub sql_types: Vec<String>,
    /// Generated columns, which pgoutput does not send.
    pub generated: Vec<bool>,
    /// Key fields: the configured ones, else the primary key by ordinal (empty: none).
    pub key_fields: Vec<String>,
    pub has_primary_key: bool,
    /// `pg_class.relreplident`: `d` default (the primary key), `n` nothing, `f` full, `i` index.
    pub replica_identity: char,
}

impl TableSchema {
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

/// Opens an ordinary connection for catalog work; errors name the server (never the
/// credentials) and what failed.
pub async fn connect(config: &PostgresConfig) -> anyhow::Result<Client> {
    connect_as(config, Session::Catalog).await
}

/// Opens an ordinary connection of kind `session` (its timeouts: [`crate::config::SessionLimits`]).
pub async fn connect_as(config: &PostgresConfig, session: Session) -> anyhow::Result<Client> {
    let dsn = config.dsn_for(session)?;
    let cfg = &dsn.config;
    let (client, connection) = cfg
        .connect(dsn.tls()?)
        .await
        .map_err(|e| connect_error(cfg, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "PostgreSQL query connection ended");
        }
    });
    Ok(client)
}

fn connect_error(cfg: &tokio_postgres::Config, e: &tokio_postgres::Error) -> anyhow::Error {
    let server = describe(cfg);
    if let Some(db) = e.as_db_error() {
        let hint = match db.code().code() {
            "28P01" | "28000" => " (check the user name and password)",
            "3D000" => " (the database does not exist)",
            _ => "",
        };
        return failure::tag_opt(
            crate::reasons::of_postgres(e),
            anyhow!(
                "cannot connect to PostgreSQL at {server}: {}{hint}",
                db.message()
            ),
        );
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text = format!("{text}: {s_text}");
        }
        source = s.source();
    }
    failure::tag(
        Reason::ConnectionFailed,
        anyhow!(
            "cannot connect to PostgreSQL at {server}: {text} (is the server running and reachable?)"
        ),
    )
}

/// Fails unless the server runs with `wal_level = logical`.
pub async fn check_wal_level(client: &Client, config: &PostgresConfig) -> anyhow::Result<()> {
    let row = client
        .query_one("SHOW wal_level", &[])
        .await
        .context("reading wal_level")?;
    let level: String = row.get(0);
    if level != "logical" {
        failure::bail!(
            Reason::ReplicationNotEnabled,
            "PostgreSQL at {} runs with wal_level = {level}; logical replication needs \
             wal_level = logical: run `ALTER SYSTEM SET wal_level = logical` (or set it in \
             postgresql.conf) and restart PostgreSQL",
            config.describe()
        );
    }
    Ok(())
}

/// Discovers one table's columns (laredo's `ColumnDefinition`s) and key.
/// The columns of the table with oid `$1`: name, types, nullability, default, length, attnum,
/// primary key ordinal, generated.
const COLUMNS_SQL: &str = "SELECT a.attname::text,
                    t.typname::text AS udt_name,
                    NOT a.attnotnull AS nullable,
                    pg_get_expr(d.adbin, d.adrelid) AS default_value,
                    COALESCE(information_schema._pg_char_max_length(
                        information_schema._pg_truetypid(a.*, t.*),
                        information_schema._pg_truetypmod(a.*, t.*)), 0)::int8 AS max_length,
                    a.attnum::int8,
                    COALESCE(pk.ord, 0)::int8 AS pk_ordinal,
                    a.atttypid::int8,
                    format_type(a.atttypid, a.atttypmod) AS sql_type,
                    bt.typname::text AS base_udt,
                    a.atttypmod,
                    a.attgenerated <> '' AS generated
               FROM pg_attribute a
               JOIN pg_type t ON t.oid = a.atttypid
               LEFT JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
               LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
               LEFT JOIN (SELECT k.attnum, k.ord
                            FROM pg_index i, unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
                           WHERE i.indrelid = $1::int8::oid AND i.indisprimary) pk
                      ON pk.attnum = a.attnum
              WHERE a.attrelid = $1::int8::oid AND a.attnum > 0 AND NOT a.attisdropped
              ORDER BY a.attnum";

/// The configured key, else the primary key, else none.
fn key_fields_of(configured_keys: &[String], columns: &[ColumnDefinition]) -> Vec<String> {
    if configured_keys.is_empty() {
        if columns.iter().any(|c| c.primary_key) {
            effective_key_fields(&[], columns)
        } else {
            Vec::new()
        }
    } else {
        configured_keys.to_vec()
    }
}

pub async fn discover(
    client: &Client,
    table: &TableId,
    configured_keys: &[String],
) -> anyhow::Result<TableSchema> {
    let exists = client
        .query_opt(
            "SELECT c.oid::int8, c.relreplident::text FROM pg_class c
              WHERE c.oid = to_regclass(format('%I.%I', $1::text, $2::text))",
            &[&table.schema, &table.table],
        )
        .await
        .with_context(|| format!("looking up table {table}"))?;
    let Some(exists) = exists else {
        failure::bail!(Reason::TableNotFound, "table {table} does not exist");
    };
    let oid: i64 = exists.get(0);
    let replica_identity: String = exists.get(1);
    let rows = client
        .query(COLUMNS_SQL, &[&oid])
        .await
        .with_context(|| format!("discovering the columns of {table}"))?;
    if rows.is_empty() {
        bail!("table {table} has no columns");
    }
    let mut columns = Vec::with_capacity(rows.len());
    let mut type_oids = Vec::with_capacity(rows.len());
    let mut type_mods = Vec::with_capacity(rows.len());
    let mut sql_types = Vec::with_capacity(rows.len());
    let mut generated = Vec::with_capacity(rows.len());
    for row in &rows {
        let pk_ordinal: i64 = row.get(6);
        // information_schema reports a domain's underlying type as udt_name.
        let udt: String = row.get(1);
        let base: Option<String> = row.get(9);
        let sql_type: String = row.get(8);
        columns.push(ColumnDefinition {
            name: row.get(0),
            type_name: base.unwrap_or(udt),
            nullable: row.get(2),
            primary_key: pk_ordinal > 0,
            // information_schema's ordinal_position (laredo's source) is the attnum: a column
            // dropped and added again under the same name gets a new one.
            ordinal_position: row.get(5),
            primary_key_ordinal: pk_ordinal,
            default_value: row.get(3),
            max_length: row.get(4),
            type_oid: 0,
            sql_type: sql_type.clone(),
        });
        let type_oid: i64 = row.get(7);
        type_oids.push(type_oid as u32);
        type_mods.push(row.get(10));
        sql_types.push(sql_type);
        generated.push(row.get(11));
    }
    let has_primary_key = columns.iter().any(|c| c.primary_key);
    let key_fields = key_fields_of(configured_keys, &columns);
    let schema = TableSchema {
        id: table.clone(),
        has_primary_key,
        replica_identity: replica_identity.chars().next().unwrap_or('d'),
        columns,
        type_oids,
        type_mods,
        sql_types,
        generated,
        key_fields,
    };
    Ok(schema)
}

/// Fails when the table has no usable key: no primary key and no key fields given, or a key
/// field that is not a column; or when it has no replica identity (publishing such a table
/// makes PostgreSQL refuse its UPDATE and DELETE statements).
pub fn check_key_fields(schema: &TableSchema) -> anyhow::Result<()> {
    if schema.key_fields.is_empty() {
        failure::bail!(
            Reason::InvalidConfig,
            "table {} has no primary key: give the key fields explicitly (--key-fields a,b)",
            schema.id
        );
    }
    for k in &schema.key_fields {
        if schema.column_index(k).is_none() {
            failure::bail!(
                Reason::ColumnNotFound,
                "key field {k:?} is not a column of table {}",
                schema.id
            );
        }
    }
    let t = &schema.id;
    let no_identity = schema.replica_identity == 'n'
        || (schema.replica_identity == 'd' && !schema.has_primary_key);
    if no_identity {
        bail!(
            "table {t} has no replica identity (no primary key, REPLICA IDENTITY {}): publishing it \
             would make PostgreSQL reject its UPDATE and DELETE statements; run ALTER TABLE {} \
             REPLICA IDENTITY FULL (or USING INDEX on a unique index) first",
            if schema.replica_identity == 'n' {
                "NOTHING"
            } else {
                "DEFAULT"
            },
            qualified(t)
        );
    }
    Ok(())
}

/// Resolves type oids to value kinds (domains to their base type, arrays to their element).
pub async fn resolve_kinds(
    client: &Client,
    oids: &[u32],
    cache: &mut HashMap<u32, Kind>,
) -> anyhow::Result<()> {
    for &oid in oids {
        if let std::collections::hash_map::Entry::Vacant(slot) = cache.entry(oid) {
            slot.insert(resolve_kind(client, oid, 0).await?);
        }
    }
    Ok(())
}

async fn resolve_kind(client: &Client, oid: u32, depth: u32) -> anyhow::Result<Kind> {
    if depth > 8 {
        return Ok(Kind::Text);
    }
    let row = client
        .query_opt(
            "SELECT t.typname::text, t.typtype::text, t.typbasetype::int8, t.typelem::int8,
                    (SELECT e.typarray FROM pg_type e WHERE e.oid = t.typelem) = t.oid AS is_array,
                    (SELECT e.typdelim::text FROM pg_type e WHERE e.oid = t.typelem) AS delim
               FROM pg_type t WHERE t.oid = $1::int8::oid",
            &[&(oid as i64)],
        )
        .await
        .with_context(|| format!("looking up type oid {oid}"))?;
    let Some(row) = row else {
        return Ok(Kind::Text);
    };
    let typname: String = row.get(0);
    let typtype: String = row.get(1);
    let base: i64 = row.get(2);
    let elem: i64 = row.get(3);
    let is_array: Option<bool> = row.get(4);
    if typtype == "d" && base != 0 {
        return Box::pin(resolve_kind(client, base as u32, depth + 1)).await;
    }
    if is_array == Some(true) {
        let delim: Option<String> = row.get(5);
        let delim = delim.and_then(|d| d.bytes().next()).unwrap_or(b',');
        let elem = Box::pin(resolve_kind(client, elem as u32, depth + 1)).await?;
        return Ok(Kind::Array {
            elem: Box::new(elem),
            delim,
        });
    }
    Ok(Kind::of_base(&typname))
}

/// Makes sure the publication exists and publishes exactly the configured tables. An existing
/// publication is only changed when larch created it for this slot; otherwise a mismatch is an
/// error naming it. Returns whether it created the publication.
async fn create_publication(
    client: &Client,
    config: &PostgresConfig,
    wanted_sql: &[String],
    owner_comment: &str,
) -> anyhow::Result<()> {
    let name = &config.publication_name;
    if !config.create_publication {
        bail!("publication {name} does not exist (and creating it is disabled)");
    }
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true); \
             COMMENT ON PUBLICATION {} IS {}",
            ident(name),
            wanted_sql.join(", "),
            ident(name),
            literal(owner_comment)
        ))
        .await
        .map_err(|e| db_error(format!("creating publication {name}"), &e))?;
    Ok(())
}

/// Another export's publication (by its owner comment) is not ours to stream through or
/// rewrite.
fn refuse_foreign_publication(
    config: &PostgresConfig,
    comment: Option<&str>,
) -> anyhow::Result<()> {
    let name = &config.publication_name;
    if let Some(OwnerRecord {
        slot,
        owner: Some(owner),
    }) = comment.and_then(OwnerRecord::parse)
        && owner != config.owner
    {
        bail!(
            "publication {name} is recorded as owned by {owner} (for replication slot {slot}), not \
             {}: choose another slot or publication name",
            config.owner
        );
    }
    Ok(())
}

pub async fn ensure_publication(client: &Client, config: &PostgresConfig) -> anyhow::Result<bool> {
    let name = &config.publication_name;
    let wanted: BTreeSet<String> = config.tables.iter().map(|t| t.to_string()).collect();
    let wanted_sql: Vec<String> = config.tables.iter().map(qualified).collect();
    let existing = client
        .query_opt(
            "SELECT p.puballtables, obj_description(p.oid, 'pg_publication'), p.pubviaroot
               FROM pg_publication p WHERE p.pubname = $1",
            &[name],
        )
        .await
        .with_context(|| format!("looking up publication {name}"))?;
    let owner_comment = owner_comment(&config.slot_name, &config.owner);
    let Some(existing) = existing else {
        create_publication(client, config, &wanted_sql, &owner_comment).await?;
        return Ok(true);
    };
    let all_tables: bool = existing.get(0);
    let comment: Option<String> = existing.get(1);
    let via_root: bool = existing.get(2);
    refuse_foreign_publication(config, comment.as_deref())?;
    if !via_root {
        publish_via_root(
            client,
            config,
            comment.as_deref() == Some(owner_comment.as_str()),
        )
        .await?;
    }
    let rows = client
        .query(
            "SELECT format('%s.%s', schemaname, tablename) FROM pg_publication_tables WHERE pubname = $1",
            &[name],
        )
        .await
        .with_context(|| format!("listing the tables of publication {name}"))?;
    let have: BTreeSet<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
    if !all_tables && have == wanted {
        return Ok(false);
    }
    if !config.create_publication {
        // A publication given by the operator only has to cover the tables.
        if wanted.is_subset(&have) {
            return Ok(false);
        }
        let missing: Vec<&String> = wanted.difference(&have).collect();
        bail!("publication {name} does not publish {missing:?}");
    }
    if comment.as_deref() == Some(owner_comment.as_str()) && !all_tables {
        client
            .batch_execute(&format!(
                "ALTER PUBLICATION {} SET TABLE {}",
                ident(name),
                wanted_sql.join(", ")
            ))
            .await
            .map_err(|e| db_error(format!("updating publication {name}"), &e))?;
        return Ok(false);
    }
    let have_list: Vec<&String> = have.iter().collect();
    bail!(
        "publication {name} already exists and publishes {} instead of exactly {:?}; it is {}, \
         and larch does not rewrite a publication it did not create for this slot: give this \
         export another publication name (--publication) or slot name (--slot)",
        if all_tables {
            "ALL TABLES".to_string()
        } else {
            format!("{have_list:?}")
        },
        wanted,
        whose(comment.as_deref())
    )
}

/// Without `publish_via_partition_root` a partitioned table's changes are published under its
/// partitions' names, which are not the exported table: they would be lost. A publication larch
/// created (before it set the option) gets it; anyone else's is an error naming the fix.
async fn publish_via_root(
    client: &Client,
    config: &PostgresConfig,
    ours: bool,
) -> anyhow::Result<()> {
    let name = &config.publication_name;
    let tables: Vec<String> = config.tables.iter().map(|t| t.to_string()).collect();
    let partitioned: Vec<String> = client
        .query(
            "SELECT format('%s.%s', n.nspname, c.relname) FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE c.relkind = 'p' AND format('%s.%s', n.nspname, c.relname) = ANY($1)",
            &[&tables],
        )
        .await
        .with_context(|| format!("looking up partitioned tables of publication {name}"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if partitioned.is_empty() {
        return Ok(());
    }
    if !ours || !config.create_publication {
        bail!(
            "publication {name} publishes the changes of partitioned table(s) {partitioned:?} \
             under their partitions' names, which larch would not see: run `ALTER PUBLICATION \
             {} SET (publish_via_partition_root = true)` or give another publication name",
            ident(name)
        );
    }
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
            ident(name)
        ))
        .await
        .map_err(|e| db_error(format!("updating publication {name}"), &e))?;
    Ok(())
}

/// Whose a publication is, by its comment: the larch record's slot and owner, or not larch's.
fn whose(comment: Option<&str>) -> String {
    match comment.and_then(OwnerRecord::parse) {
        Some(OwnerRecord {
            slot,
            owner: Some(owner),
        }) => format!("recorded as created for replication slot {slot} by {owner}"),
        Some(OwnerRecord { slot, owner: None }) => format!(
            "recorded as created for replication slot {slot} by a larch version that recorded no owner"
        ),
        None => "not created by larch (it has no larch owner record)".to_string(),
    }
}

/// Fails when the publication sends only some columns of a table (PostgreSQL 15 column lists):
/// larch archives whole rows, and its stream would see another column list than its schema.
pub async fn check_published_columns(
    client: &Client,
    publication: &str,
    schema: &TableSchema,
) -> anyhow::Result<()> {
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .await
        .context("reading server_version_num")?
        .get(0);
    if version < 150000 {
        return Ok(()); // no column lists before PostgreSQL 15
    }
    let row = client
        .query_opt(
            "SELECT attnames::text[] FROM pg_publication_tables
              WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &schema.id.schema, &schema.id.table],
        )
        .await
        .with_context(|| format!("reading the columns publication {publication} sends"))?;
    let Some(row) = row else { return Ok(()) };
    let published: Vec<String> = row.get::<_, Option<Vec<String>>>(0).unwrap_or_default();
    let missing: Vec<&str> = schema
        .columns
        .iter()
        .zip(&schema.generated)
        .filter(|(c, generated)| !**generated && !published.contains(&c.name))
        .map(|(c, _)| c.name.as_str())
        .collect();
    if !missing.is_empty() {
        bail!(
            "publication {publication} sends only some columns of table {} (not {}): larch \
             archives whole rows; publish the table without a column list",
            schema.id,
            missing.join(", ")
        );
    }
    Ok(())
}

/// `what: <the server's message>`, tagged with the reason of its SQLSTATE; a data error's
/// message is withheld ([`crate::errors`]).
pub fn db_error(what: impl std::fmt::Display, e: &tokio_postgres::Error) -> anyhow::Error {
    failure::tag_opt(
        crate::reasons::of_postgres(e),
        anyhow!("{what}: {}", db_message(e)),
    )
}

/// A server error's message (with detail; reduced for a data error), else the error's text.
pub fn db_message(e: &tokio_postgres::Error) -> String {
    crate::errors::message(e)
}

/// What `pg_replication_slots` says about a slot.
#[derive(Clone, Debug)]
pub struct SlotInfo {
    pub plugin: Option<String>,
    pub temporary: bool,
    pub confirmed_flush: Option<u64>,
    pub wal_status: Option<String>,
    pub active_pid: Option<i32>,
    pub database: Option<String>,
}

pub async fn slot_info(client: &Client, slot: &str) -> anyhow::Result<Option<SlotInfo>> {
    let row = client
        .query_opt(
            "SELECT plugin::text, temporary, confirmed_flush_lsn::text, wal_status, active_pid, database::text
               FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .with_context(|| format!("looking up replication slot {slot}"))?;
    Ok(row.map(|r| {
        let confirmed: Option<String> = r.get(2);
        SlotInfo {
            plugin: r.get(0),
            temporary: r.get(1),
            confirmed_flush: confirmed
                .and_then(|c| larch_archive::position::Lsn::parse(&c))
                .map(|l| l.0),
            wal_status: r.get(3),
            active_pid: r.get(4),
            database: r.get(5),
        }
    }))
}
