//! The raw values of the masked columns, streamed from the source database with COPY.

use futures::StreamExt;
use larch_archive::model::TableId;

/// Streams every non-NULL value of `columns` of `table` as text, calling `f(column index,
/// value)`; holds one COPY message and one value at a time.
pub async fn for_each_value(
    client: &tokio_postgres::Client,
    table: &TableId,
    columns: &[String],
    mut f: impl FnMut(usize, &str),
) -> anyhow::Result<u64> {
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
    futures::pin_mut!(stream);
    let (mut pending, mut scratch, mut rows) = (Vec::<u8>::new(), Vec::<u8>::new(), 0u64);
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| anyhow::anyhow!("reading the masked columns of {table}: {e}"))?;
        pending.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(nl) = memchr::memchr(b'\n', &pending[start..]) {
            let line = &pending[start..start + nl];
            for (i, field) in line.split(|b| *b == b'\t').enumerate() {
                if field != b"\\N" {
                    f(i, unescape(field, &mut scratch)?);
                }
            }
            rows += 1;
            start += nl + 1;
        }
        pending.drain(..start);
    }
    Ok(rows)
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
