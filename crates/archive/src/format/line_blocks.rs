//! A JSONL object read as blocks of whole lines, for decoders on several threads: one thread
//! reads and cuts the object at line ends (cheap), the others parse the blocks' lines. The
//! lines are the ones [`super::jsonl::LineReader`] reads: `\r` and trailing blanks stripped,
//! blank lines skipped, numbered, UTF-8 checked, at most 16 MiB.

use std::io::BufRead;

use super::MAX_JSONL_LINE;
use crate::error::{ArchiveError, Result};

/// Whole lines of a JSONL object, the first numbered `first_line` (from 1).
pub struct LineBlock {
    pub first_line: u64,
    pub bytes: Vec<u8>,
}

impl LineBlock {
    /// The block's non-blank lines with their numbers; an error names `key` and the line.
    pub fn lines<'a>(&'a self, key: &'a str) -> impl Iterator<Item = Result<(u64, &'a str)>> + 'a {
        let mut rest: &[u8] = &self.bytes;
        let mut line_no = self.first_line;
        std::iter::from_fn(move || {
            while !rest.is_empty() {
                let (line, next) = match memchr::memchr(b'\n', rest) {
                    Some(i) => (&rest[..i], &rest[i + 1..]),
                    None => (rest, &[][..]),
                };
                rest = next;
                let number = line_no;
                line_no += 1;
                let end = line
                    .iter()
                    .rposition(|c| !matches!(c, b'\r' | b' ' | b'\t'))
                    .map_or(0, |i| i + 1);
                let line = &line[..end];
                if line.iter().all(|c| c.is_ascii_whitespace()) {
                    continue;
                }
                return Some(
                    std::str::from_utf8(line)
                        .map(|text| (number, text))
                        .map_err(|e| ArchiveError::BadLine {
                            key: key.to_string(),
                            line: number,
                            detail: format!("not UTF-8: {e}"),
                        }),
                );
            }
            None
        })
    }
}

/// Reads `reader` (a JSONL object named `key`) to its end, calling `f` with blocks of whole
/// lines of about `target` bytes (a longer line is a block of its own).
pub fn for_each_block(
    key: &str,
    mut reader: Box<dyn BufRead + '_>,
    target: usize,
    mut f: impl FnMut(LineBlock) -> Result<()>,
) -> Result<()> {
    let mut block = Vec::with_capacity(target + (64 << 10));
    let mut first_line = 1u64;
    loop {
        let available = reader
            .fill_buf()
            .map_err(|e| ArchiveError::storage(key, e))?;
        if available.is_empty() {
            break;
        }
        let take = available
            .len()
            .min(target.saturating_sub(block.len()).max(64 << 10));
        block.extend_from_slice(&available[..take]);
        reader.consume(take);
        if block.len() < target {
            continue;
        }
        match memchr::memrchr(b'\n', &block) {
            Some(end) => {
                let tail = block.split_off(end + 1);
                let lines = memchr::memchr_iter(b'\n', &block).count() as u64;
                let full = std::mem::replace(&mut block, tail);
                block.reserve(target + (64 << 10));
                f(LineBlock {
                    first_line,
                    bytes: full,
                })?;
                first_line += lines;
            }
            None if block.len() > MAX_JSONL_LINE => {
                return Err(ArchiveError::BadLine {
                    key: key.to_string(),
                    line: first_line,
                    detail: "line exceeds the 16 MiB limit".into(),
                });
            }
            None => {}
        }
    }
    if !block.is_empty() {
        f(LineBlock {
            first_line,
            bytes: block,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::jsonl::LineReader;

    fn blocks(text: &[u8], target: usize) -> Vec<LineBlock> {
        let mut got = Vec::new();
        for_each_block("k", Box::new(text), target, |b| {
            got.push(b);
            Ok(())
        })
        .unwrap();
        got
    }

    /// Whatever the block size, the lines and their numbers are the ones a [`LineReader`]
    /// reads, every block ending at a line end.
    #[test]
    fn blocks_hold_the_lines_a_line_reader_reads() {
        let mut text = Vec::new();
        for i in 0..5000 {
            match i % 97 {
                0 => text.extend_from_slice(b"\n"),
                1 => text.extend_from_slice(b"  \r\n"),
                _ => text.extend_from_slice(format!("{{\"id\":{i},\"s\":\"x\"}}\r\n").as_bytes()),
            }
        }
        text.extend_from_slice(b"{\"last\":true}");
        let mut want = Vec::new();
        let mut reader = LineReader::new("k", Box::new(&text[..]));
        while let Some(line) = reader.next_line().unwrap() {
            let line = line.to_string();
            want.push((reader.line_no, line));
        }
        for target in [1, 100, 4096, 1 << 20] {
            let got: Vec<(u64, String)> = blocks(&text, target)
                .iter()
                .flat_map(|b| {
                    assert!(b.bytes.ends_with(b"\n") || b.bytes.ends_with(b"true}"));
                    b.lines("k")
                        .map(|l| l.map(|(n, s)| (n, s.to_string())).unwrap())
                        .collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(got, want, "target {target}");
        }
    }

    #[test]
    fn a_bad_line_is_named_by_its_number() {
        let text = b"{\"a\":1}\n{\"a\":\xff}\n".to_vec();
        let b = blocks(&text, 4);
        let errors: Vec<String> = b
            .iter()
            .flat_map(|b| b.lines("obj.jsonl").filter_map(|l| l.err()))
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("obj.jsonl") && errors[0].contains('2'),
            "{errors:?}"
        );
    }
}
