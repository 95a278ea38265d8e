//! Buffers for COPY chunks, used again once a stream has sent them: a chunk handed to a COPY
//! stream returns its buffer to the pool when the stream drops it. Fresh buffers of this size
//! each cost the kernel new pages (with transparent huge pages, 2 MiB zeroed per chunk);
//! reused ones do not.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Buffers of at least `capacity` bytes, `keep` of them kept when returned.
#[derive(Clone)]
pub struct ChunkPool {
    free: Arc<Mutex<Vec<Vec<u8>>>>,
    capacity: usize,
    keep: usize,
}

impl ChunkPool {
    pub fn new(capacity: usize, keep: usize) -> ChunkPool {
        ChunkPool {
            free: Arc::new(Mutex::new(Vec::with_capacity(keep))),
            capacity,
            keep,
        }
    }

    /// An empty buffer of at least the pool's capacity.
    pub fn take(&self) -> Vec<u8> {
        let reused = self.free.lock().expect("chunk pool").pop();
        reused.unwrap_or_else(|| Vec::with_capacity(self.capacity))
    }

    /// `chunk` as [`Bytes`] whose buffer returns to the pool when the last of them drops.
    pub fn freeze(&self, chunk: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf: chunk,
            pool: self.clone(),
        })
    }
}

struct Pooled {
    buf: Vec<u8>,
    pool: ChunkPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        // A chunk grown far past the pool's size by a long row gives its memory back.
        if !(self.pool.capacity..=self.pool.capacity * 4).contains(&buf.capacity()) {
            return;
        }
        buf.clear();
        let mut free = self.pool.free.lock().expect("chunk pool");
        if free.len() < self.pool.keep {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_chunks_buffer_is_taken_again() {
        let pool = ChunkPool::new(1024, 2);
        let mut buf = pool.take();
        assert!(buf.capacity() >= 1024);
        buf.extend_from_slice(b"rows");
        let at = buf.as_ptr();
        let chunk = pool.freeze(buf);
        assert_eq!(&chunk[..], b"rows");
        // Still in flight: a new buffer.
        let other = pool.take();
        assert_ne!(other.as_ptr(), at);
        drop(chunk);
        let again = pool.take();
        assert_eq!(again.as_ptr(), at);
        assert!(again.is_empty());
    }

    #[test]
    fn the_pool_keeps_at_most_its_share() {
        let pool = ChunkPool::new(16, 1);
        let chunks: Vec<Bytes> = (0..3).map(|_| pool.freeze(pool.take())).collect();
        drop(chunks);
        assert_eq!(pool.free.lock().unwrap().len(), 1);
        // Buffers smaller than the pool's capacity, or far bigger, are not kept.
        drop(pool.take());
        drop(pool.freeze(Vec::with_capacity(4)));
        drop(pool.freeze(Vec::with_capacity(16 * 5)));
        assert_eq!(pool.free.lock().unwrap().len(), 0);
    }
}
