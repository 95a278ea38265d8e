//! The consistent baseline: a new replication slot exports its snapshot; the table is copied
//! with `COPY … TO STDOUT` (text format) inside a REPEATABLE READ transaction that imports that
//! snapshot while the slot's session stays open. Rows are streamed one by one into the channel
//! (bounded memory, backpressure); the slot's consistent point is the baseline position.

use std::collections::HashMap;

use anyhow::{Context, anyhow, bail};
use futures::StreamExt;
use pgwire_replication::ReplicationClient;
use tokio::sync::mpsc;

use super::config::{PostgresConfig, SlotMode, ident, qualified};
use super::schema::{TableSchema, db_message};
use super::types::{Kind, to_json};
use crate::archive::model::TableId;
use crate::archive::position::Lsn;
use crate::archive::value::{Row, RowMap, raw};
use crate::source::SourceError;

/// A freshly created slot whose session is still open.
pub struct CreatedSlot {
    pub session: ReplicationClient,
    pub consistent_point: u64,
    pub snapshot: String,
}

/// Opens a gated replication session and creates the slot with an exported snapshot.
pub async fn create_slot(config: &PostgresConfig) -> anyhow::Result<CreatedSlot> {
    let rc = config.replication(0, None)?;
    let mut session = ReplicationClient::connect_gated(rc)
        .await
        .map_err(|e| replication_error(config, &e))?;
    let sql = format!(
        "CREATE_REPLICATION_SLOT {} {}LOGICAL pgoutput (SNAPSHOT 'export')",
        ident(&config.slot_name),
        if config.slot_mode == SlotMode::Temporary {
            "TEMPORARY "
        } else {
            ""
        }
    );
    let rows = session.simple_query(&sql).await.map_err(|e| {
        anyhow!(
            "creating replication slot {}: {}",
            config.slot_name,
            replication_error(config, &e)
        )
    })?;
    let row = rows
        .first()
        .context("CREATE_REPLICATION_SLOT returned no row")?;
    let text = |i: usize| -> anyhow::Result<String> {
        let b = row
            .get(i)
            .and_then(|c| c.as_ref())
            .context("CREATE_REPLICATION_SLOT: missing column")?;
        Ok(String::from_utf8_lossy(b).into_owned())
    };
    let consistent = text(1)?;
    let consistent_point = Lsn::parse(&consistent)
        .with_context(|| format!("CREATE_REPLICATION_SLOT: bad consistent point {consistent:?}"))?
        .0;
    let snapshot = text(2)?;
    Ok(CreatedSlot {
        session,
        consistent_point,
        snapshot,
    })
}

/// Drops a (persistent) slot that is not in use.
pub async fn drop_slot(client: &tokio_postgres::Client, slot: &str) -> anyhow::Result<()> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .map_err(|e| anyhow!("dropping replication slot {slot}: {}", db_message(&e)))?;
    Ok(())
}

/// Makes a replication-session error readable, naming the server (never the credentials).
pub fn replication_error(
    config: &PostgresConfig,
    e: &pgwire_replication::PgWireError,
) -> anyhow::Error {
    use pgwire_replication::PgWireError as E;
    let server = config.describe();
    match e {
        E::Auth(m) => anyhow!(
            "cannot connect to PostgreSQL at {server}: {m} (check the user name and password)"
        ),
        E::Io(io) => anyhow!(
            "cannot connect to PostgreSQL at {server}: {io} (is the server running and reachable?)"
        ),
        other => anyhow!("replication connection to {server}: {other}"),
    }
}

/// Copies every row of `schema` as of `snapshot` into `rows`. Returns the number of rows.
pub async fn copy_table(
    client: &tokio_postgres::Client,
    schema: &TableSchema,
    kinds: &HashMap<u32, Kind>,
    rows: &mpsc::Sender<(TableId, Row)>,
) -> Result<u64, SourceError> {
    let cols: Vec<String> = schema.columns.iter().map(|c| ident(&c.name)).collect();
    let sql = format!(
        "COPY (SELECT {} FROM {}) TO STDOUT",
        cols.join(", "),
        qualified(&schema.id)
    );
    let stream = client
        .copy_out(&sql)
        .await
        .map_err(|e| anyhow!("copying table {}: {}", schema.id, db_message(&e)))?;
    futures::pin_mut!(stream);
    let col_kinds: Vec<&Kind> = schema
        .type_oids
        .iter()
        .map(|oid| kinds.get(oid).unwrap_or(&Kind::Text))
        .collect();
    let mut pending: Vec<u8> = Vec::new();
    let mut count = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| anyhow!("copying table {}: {}", schema.id, db_message(&e)))?;
        pending.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(nl) = pending[start..].iter().position(|&b| b == b'\n') {
            let line = &pending[start..start + nl];
            let row = parse_copy_line(line, schema, &col_kinds)
                .map_err(|e| anyhow!("copying table {}: {e}", schema.id))?;
            rows.send((schema.id.clone(), row))
                .await
                .map_err(|_| SourceError::Stopped)?;
            count += 1;
            start += nl + 1;
        }
        pending.drain(..start);
    }
    if !pending.is_empty() {
        return Err(anyhow!("copying table {}: output ended inside a row", schema.id).into());
    }
    Ok(count)
}

fn parse_copy_line(line: &[u8], schema: &TableSchema, kinds: &[&Kind]) -> anyhow::Result<Row> {
    let mut map = RowMap::new();
    let fields: Vec<&[u8]> = line.split(|&b| b == b'\t').collect();
    if fields.len() != schema.columns.len() {
        bail!(
            "COPY row has {} fields, expected {}",
            fields.len(),
            schema.columns.len()
        );
    }
    for ((field, col), kind) in fields.iter().zip(&schema.columns).zip(kinds) {
        let value = if *field == b"\\N" {
            raw("null")
        } else {
            let text = unescape_copy(field)
                .with_context(|| format!("column {}: invalid COPY text", col.name))?;
            to_json(kind, &text)
        };
        map.insert(col.name.clone(), value);
    }
    Ok(Row::from_map(&map))
}

/// Undoes COPY text-format escaping.
pub fn unescape_copy(field: &[u8]) -> anyhow::Result<String> {
    if !field.contains(&b'\\') {
        return Ok(std::str::from_utf8(field)?.to_string());
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let c = field[i];
        if c != b'\\' || i + 1 == field.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let n = field[i + 1];
        i += 2;
        match n {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = (n - b'0') as u32;
                let mut k = 0;
                while k < 2 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + (field[i] - b'0') as u32;
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut k = 0;
                while k < 2 && i < field.len() && field[i].is_ascii_hexdigit() {
                    v = v * 16 + (field[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    k += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    Ok(String::from_utf8(out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_unescape() {
        assert_eq!(unescape_copy(b"a\\tb\\nc\\\\d").unwrap(), "a\tb\nc\\d");
        assert_eq!(unescape_copy(b"\\\\x0102").unwrap(), "\\x0102");
        assert_eq!(unescape_copy(b"plain").unwrap(), "plain");
    }
}
