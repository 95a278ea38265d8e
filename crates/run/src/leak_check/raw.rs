//! The raw values of the masked columns, streamed from the source database with COPY.
//!
//! The connection's task only forwards the COPY data, in blocks, through a bounded queue to a
//! thread of its own that splits, unescapes and hands on each value: the server's COPY, the
//! client's receiving and what is done with the values (spelling and hashing them) overlap.

use futures::StreamExt;
use larch_archive::model::TableId;
use tokio::sync::mpsc;

/// Bytes of COPY data per block handed to the parsing thread, and blocks queued at most: what
/// memory holds of the raw values at once besides one row.
const BLOCK: usize = 256 * 1024;
const QUEUE: usize = 4;

/// Streams every non-NULL value of `columns` of `table` as text into `state`, calling
/// `f(state, column index, value)` on a thread of its own; returns the state.
pub async fn fold_values<S, F>(
    client: &tokio_postgres::Client,
    table: &TableId,
    columns: &[String],
    state: S,
    f: F,
) -> anyhow::Result<S>
where
    S: Send + 'static,
    F: FnMut(&mut S, usize, &str) + Send + 'static,
{
    let select: Vec<String> = columns
        .iter()
        .map(|c| format!("{}::text", quote(c)))
        .collect();
    let sql = format!(
        "COPY (SELECT {} FROM {}.{}) TO STDOUT",
        select.join(", "),
        quote(&table.schema),
        quote(&table.table)
    );
    let stream = client
        .copy_out(&sql)
        .await
        .map_err(|e| anyhow::anyhow!("reading the masked columns of {table}: {e}"))?;
    let (blocks, queue) = mpsc::channel::<Vec<u8>>(QUEUE);
    let parser = tokio::task::spawn_blocking(move || parse(queue, state, f));
    let forwarded = forward(stream, blocks).await;
    let parsed = parser.await.expect("the raw values' parsing thread");
    // The stream's error first: a parser that stopped early saw only part of the data.
    forwarded.map_err(|e| anyhow::anyhow!("reading the masked columns of {table}: {e}"))?;
    parsed
}

/// Sends the COPY data in blocks of about [`BLOCK`] bytes until it ends or the parser stops.
async fn forward(
    stream: tokio_postgres::CopyOutStream,
    blocks: mpsc::Sender<Vec<u8>>,
) -> Result<(), tokio_postgres::Error> {
    futures::pin_mut!(stream);
    let mut block = Vec::with_capacity(BLOCK + 4096);
    while let Some(chunk) = stream.next().await {
        block.extend_from_slice(&chunk?);
        if block.len() >= BLOCK {
            let full = std::mem::replace(&mut block, Vec::with_capacity(BLOCK + 4096));
            if blocks.send(full).await.is_err() {
                return Ok(()); // the parser stopped on an error of its own
            }
        }
    }
    if !block.is_empty() {
        let _ = blocks.send(block).await;
    }
    Ok(())
}

/// The parsing thread: splits the blocks into rows (one a line) and fields (tab-separated).
fn parse<S, F>(mut queue: mpsc::Receiver<Vec<u8>>, mut state: S, mut f: F) -> anyhow::Result<S>
where
    F: FnMut(&mut S, usize, &str),
{
    let (mut pending, mut scratch) = (Vec::<u8>::new(), Vec::<u8>::new());
    while let Some(block) = queue.blocking_recv() {
        let data = if pending.is_empty() {
            block
        } else {
            pending.extend_from_slice(&block);
            std::mem::take(&mut pending)
        };
        let mut start = 0;
        while let Some(nl) = memchr::memchr(b'\n', &data[start..]) {
            let line = &data[start..start + nl];
            for (i, field) in line.split(|b| *b == b'\t').enumerate() {
                if field != b"\\N" {
                    f(&mut state, i, unescape(field, &mut scratch)?);
                }
            }
            start += nl + 1;
        }
        pending.clear();
        pending.extend_from_slice(&data[start..]);
    }
    Ok(state)
}

/// A double-quoted SQL identifier.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// COPY's text format: backslash escapes (`\\`, `\t`, `\n`, `\r`, `\b`, `\f`, `\v`). A field
/// without any is borrowed as is; one with some is unescaped into `scratch`.
fn unescape<'a>(field: &'a [u8], scratch: &'a mut Vec<u8>) -> anyhow::Result<&'a str> {
    let bytes = if memchr::memchr(b'\\', field).is_none() {
        field
    } else {
        scratch.clear();
        let mut it = field.iter();
        while let Some(&b) = it.next() {
            if b != b'\\' {
                scratch.push(b);
                continue;
            }
            scratch.push(match it.next() {
                Some(b'n') => b'\n',
                Some(b't') => b'\t',
                Some(b'r') => b'\r',
                Some(b'b') => 8,
                Some(b'f') => 12,
                Some(b'v') => 11,
                Some(&other) => other,
                None => b'\\',
            });
        }
        scratch.as_slice()
    };
    std::str::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("the server sent a value that is not UTF-8"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_text_unescapes() {
        let mut scratch = Vec::new();
        let s = super::unescape(br"a\tb\\c\nd", &mut scratch).unwrap();
        assert_eq!(s, "a\tb\\c\nd");
        assert_eq!(super::unescape(b"plain", &mut scratch).unwrap(), "plain");
    }
}
