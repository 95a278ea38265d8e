//! A decoder for the pgoutput logical replication protocol, version 1 (text tuples).
//! Begin and Commit are framed by the transport (pgwire-replication); everything else in an
//! XLogData payload is decoded here.

use anyhow::{Context, bail};

/// One column of a tuple.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cell {
    Null,
    /// An unchanged TOASTed value that the server did not send (`u`).
    Unchanged,
    Text(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelationColumn {
    /// Part of the replica identity (flag bit 1).
    pub key: bool,
    pub name: String,
    pub type_oid: u32,
    pub type_mod: i32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// The old tuple of an update or delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OldTuple {
    /// `K`: the replica identity key columns only (others are `Null`).
    Key(Vec<Cell>),
    /// `O`: the whole old row (REPLICA IDENTITY FULL).
    Full(Vec<Cell>),
}

impl OldTuple {
    pub fn cells(&self) -> &[Cell] {
        match self {
            OldTuple::Key(c) | OldTuple::Full(c) => c,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Relation(Relation),
    Insert {
        rel: u32,
        new: Vec<Cell>,
    },
    Update {
        rel: u32,
        old: Option<OldTuple>,
        new: Vec<Cell>,
    },
    Delete {
        rel: u32,
        old: OldTuple,
    },
    Truncate {
        rels: Vec<u32>,
        cascade: bool,
        restart_identity: bool,
    },
    /// Type, Origin, logical messages and anything else larch does not use.
    Other(u8),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            bail!(
                "pgoutput message truncated at byte {} (wanted {n} more)",
                self.pos
            )
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> anyhow::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn i16(&mut self) -> anyhow::Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into()?))
    }
    fn i32(&mut self) -> anyhow::Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into()?))
    }
    fn u32(&mut self) -> anyhow::Result<u32> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into()?))
    }
    fn cstr(&mut self) -> anyhow::Result<String> {
        let rest = &self.buf[self.pos..];
        let nul = rest
            .iter()
            .position(|&c| c == 0)
            .context("pgoutput string without terminator")?;
        let s = std::str::from_utf8(&rest[..nul]).context("pgoutput string is not UTF-8")?;
        self.pos += nul + 1;
        Ok(s.to_string())
    }
    fn tuple(&mut self) -> anyhow::Result<Vec<Cell>> {
        let n = self.i16()?;
        let mut cells = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n {
            cells.push(match self.u8()? {
                b'n' => Cell::Null,
                b'u' => Cell::Unchanged,
                b't' => {
                    let len = self.i32()?;
                    let len = usize::try_from(len).context("negative pgoutput value length")?;
                    let bytes = self.take(len)?;
                    Cell::Text(
                        std::str::from_utf8(bytes)
                            .context("pgoutput text value is not UTF-8")?
                            .to_string(),
                    )
                }
                b'b' => bail!("pgoutput sent a binary value; larch requests text tuples"),
                other => bail!("unknown pgoutput tuple cell kind {:?}", other as char),
            });
        }
        Ok(cells)
    }
}

/// Decodes one pgoutput message (the payload of an XLogData frame).
pub fn decode(buf: &[u8]) -> anyhow::Result<Message> {
    let mut r = Reader { buf, pos: 0 };
    let tag = r.u8()?;
    Ok(match tag {
        b'R' => Message::Relation(r.relation()?),
        b'I' => r.insert()?,
        b'U' => r.update()?,
        b'D' => r.delete()?,
        b'T' => r.truncate()?,
        other => Message::Other(other),
    })
}

/// The bodies of the messages, after their tag byte.
impl Reader<'_> {
    fn relation(&mut self) -> anyhow::Result<Relation> {
        let oid = self.u32()?;
        let namespace = self.cstr()?;
        let name = self.cstr()?;
        let replica_identity = self.u8()?;
        let n = self.i16()?;
        let mut columns = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n {
            let flags = self.u8()?;
            let name = self.cstr()?;
            let type_oid = self.u32()?;
            let type_mod = self.i32()?;
            columns.push(RelationColumn {
                key: flags & 1 == 1,
                name,
                type_oid,
                type_mod,
            });
        }
        Ok(Relation {
            oid,
            // pgoutput sends an empty namespace for pg_catalog.
            namespace: if namespace.is_empty() {
                "pg_catalog".to_string()
            } else {
                namespace
            },
            name,
            replica_identity,
            columns,
        })
    }

    #[inline]
    fn insert(&mut self) -> anyhow::Result<Message> {
        let rel = self.u32()?;
        match self.u8()? {
            b'N' => Ok(Message::Insert {
                rel,
                new: self.tuple()?,
            }),
            other => bail!("pgoutput insert: expected N, got {:?}", other as char),
        }
    }

    #[inline]
    fn update(&mut self) -> anyhow::Result<Message> {
        let rel = self.u32()?;
        let mut old = None;
        let mut kind = self.u8()?;
        if kind == b'K' || kind == b'O' {
            let cells = self.tuple()?;
            old = Some(if kind == b'K' {
                OldTuple::Key(cells)
            } else {
                OldTuple::Full(cells)
            });
            kind = self.u8()?;
        }
        if kind != b'N' {
            bail!("pgoutput update: expected N, got {:?}", kind as char);
        }
        Ok(Message::Update {
            rel,
            old,
            new: self.tuple()?,
        })
    }

    #[inline]
    fn delete(&mut self) -> anyhow::Result<Message> {
        let rel = self.u32()?;
        let old = match self.u8()? {
            b'K' => OldTuple::Key(self.tuple()?),
            b'O' => OldTuple::Full(self.tuple()?),
            other => bail!("pgoutput delete: expected K or O, got {:?}", other as char),
        };
        Ok(Message::Delete { rel, old })
    }

    fn truncate(&mut self) -> anyhow::Result<Message> {
        let n = self.u32()?;
        let options = self.u8()?;
        let mut rels = Vec::with_capacity(n.min(1 << 16) as usize);
        for _ in 0..n {
            rels.push(self.u32()?);
        }
        Ok(Message::Truncate {
            rels,
            cascade: options & 1 == 1,
            restart_identity: options & 2 == 2,
        })
    }
}

#[cfg(test)]
mod tests;
