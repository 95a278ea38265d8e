//! Reading a just-written object back to take its SHA-256 (a digest cannot be combined from
//! the digests of its parts). Where the store serves byte ranges (S3's ranged GET) several
//! ranges are fetched at once and hashed in order, so the read-back of a big object goes at
//! the hash's speed rather than one connection's; elsewhere the object is streamed once.
//! Memory: at most [`RANGES_AT_ONCE`] ranges of [`RANGE`] bytes.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;

use super::Store;
use crate::error::{ArchiveError, Result};

/// Bytes fetched per ranged read.
pub const RANGE: u64 = 8 << 20;
/// Ranged reads in flight at once.
pub const RANGES_AT_ONCE: usize = 4;

/// The SHA-256 (hex) and size of object `key` as stored.
pub async fn digest_object(store: Arc<dyn Store>, key: &str) -> Result<(String, u64)> {
    let gone = || ArchiveError::storage(store.uri(key), "the completed upload is not there");
    if store.serves_ranges() {
        let size = store.head(key).await?.ok_or_else(gone)?.size;
        return digest_ranges(store, key, size).await;
    }
    let mut reader = store.open(key).await?.ok_or_else(gone)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|e| ArchiveError::storage(store.uri(key), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), size))
}

async fn digest_ranges(store: Arc<dyn Store>, key: &str, size: u64) -> Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut in_flight: VecDeque<JoinHandle<Result<Bytes>>> = VecDeque::new();
    let (mut next, mut hashed) = (0u64, 0u64);
    let result = loop {
        while in_flight.len() < RANGES_AT_ONCE && next < size {
            let len = RANGE.min(size - next);
            let (store, key, start) = (store.clone(), key.to_string(), next);
            in_flight.push_back(tokio::spawn(async move {
                store.read_range(&key, start, len).await
            }));
            next += len;
        }
        let Some(first) = in_flight.pop_front() else {
            break Ok(());
        };
        match first.await {
            Ok(Ok(bytes)) => {
                hasher.update(&bytes);
                hashed += bytes.len() as u64;
            }
            Ok(Err(e)) => break Err(e),
            Err(e) => {
                break Err(ArchiveError::storage(
                    store.uri(key),
                    format!("reading the object back: {e}"),
                ));
            }
        }
    };
    for h in in_flight {
        h.abort();
    }
    result?;
    if hashed != size {
        return Err(ArchiveError::storage(
            store.uri(key),
            format!("read back {hashed} bytes of the {size} stored"),
        ));
    }
    Ok((hex::encode(hasher.finalize()), size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn ranges_read_at_once_hash_in_order() {
        let store = MemoryStore::new();
        // Three ranges and a bit: more than are read at once, the last one short.
        let bytes: Vec<u8> = (0..(RANGE * 4 + 12_345)).map(|i| (i % 251) as u8).collect();
        store.insert_raw("t/snapshot.jsonl", bytes.clone());
        let store: Arc<dyn Store> = Arc::new(store);
        assert!(store.serves_ranges());
        let (sha, size) = digest_object(store.clone(), "t/snapshot.jsonl")
            .await
            .unwrap();
        assert_eq!(size, bytes.len() as u64);
        assert_eq!(sha, hex::encode(Sha256::digest(&bytes)));
        let missing = digest_object(store, "t/absent.jsonl").await.unwrap_err();
        assert!(missing.to_string().contains("not there"), "{missing}");
    }
}
