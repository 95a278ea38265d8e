//! The k-way merge of a buffer's runs and memory that keeps the newest entry per identity.

use std::collections::BinaryHeap;

use super::run::RunReader;
use super::{ChangeBuffer, Entry};
use crate::error::Result;
use crate::identity::Identity;

pub(super) enum Source<'a> {
    Memory(std::collections::btree_map::Iter<'a, Identity, Entry>),
    Run(RunReader),
}

impl Source<'_> {
    fn next(&mut self) -> Result<Option<(Identity, Entry)>> {
        match self {
            Source::Memory(it) => Ok(it.next().map(|(id, e)| (id.clone(), e.clone()))),
            Source::Run(r) => r.next(),
        }
    }
}

/// The head entry of one source in the merge heap: smallest identity first, then the newest
/// source (highest index).
struct Head {
    id: Identity,
    source: usize,
    entry: Entry,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.source == other.source
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.id.cmp(&self.id).then(self.source.cmp(&other.source))
    }
}

/// A k-way merge of sorted sources (oldest first) yielding the newest entry per identity.
pub struct Merged<'a> {
    sources: Vec<Source<'a>>,
    heap: BinaryHeap<Head>,
}

impl<'a> Merged<'a> {
    /// The merge of several buffers, oldest first (a snapshot's rows, then the changes since).
    pub fn of(buffers: &[&'a ChangeBuffer]) -> Result<Merged<'a>> {
        let mut sources = Vec::new();
        for b in buffers {
            for r in &b.runs {
                sources.push(Source::Run(RunReader::open(r)?));
            }
            sources.push(Source::Memory(b.memory.iter()));
        }
        Merged::new(sources)
    }

    pub(super) fn new(mut sources: Vec<Source<'a>>) -> Result<Merged<'a>> {
        let mut heap = BinaryHeap::with_capacity(sources.len());
        for (i, s) in sources.iter_mut().enumerate() {
            if let Some((id, entry)) = s.next()? {
                heap.push(Head {
                    id,
                    source: i,
                    entry,
                });
            }
        }
        Ok(Merged { sources, heap })
    }

    fn refill(&mut self, source: usize) -> Result<()> {
        if let Some((id, entry)) = self.sources[source].next()? {
            self.heap.push(Head { id, source, entry });
        }
        Ok(())
    }
}

impl Iterator for Merged<'_> {
    type Item = Result<(Identity, Entry)>;

    fn next(&mut self) -> Option<Self::Item> {
        let newest = self.heap.pop()?;
        let step = (|| {
            self.refill(newest.source)?;
            // Older entries of the same identity lose.
            while self.heap.peek().is_some_and(|h| h.id == newest.id) {
                let older = self.heap.pop().expect("peeked");
                self.refill(older.source)?;
            }
            Ok(())
        })();
        Some(step.map(|()| (newest.id, newest.entry)))
    }
}
