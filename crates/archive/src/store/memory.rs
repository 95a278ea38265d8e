//! In-memory store for fast unit tests. Revisions are SHA-256 of the content, like local.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::{
    GetResult, ObjectInfo, ObjectReader, ObjectWriter, PutResult, Store, check_key, sha256_hex,
};
use crate::error::{ArchiveError, Result};
use larch_core::locks::MutexExt;

/// An object's bytes and when they were written (the `modified` of a listing).
#[derive(Debug, Clone)]
struct Stored {
    bytes: Bytes,
    modified: DateTime<Utc>,
}

impl Stored {
    fn now(bytes: Bytes) -> Stored {
        Stored {
            bytes,
            modified: Utc::now(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    objects: Arc<Mutex<BTreeMap<String, Stored>>>,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    pub fn keys(&self) -> Vec<String> {
        self.objects.locked().keys().cloned().collect()
    }

    /// Overwrites an object directly (tests that corrupt archives).
    pub fn insert_raw(&self, key: &str, bytes: impl Into<Bytes>) {
        self.objects
            .locked()
            .insert(key.to_string(), Stored::now(bytes.into()));
    }
}

struct MemoryWriter {
    store: MemoryStore,
    key: String,
    buf: Vec<u8>,
}

#[async_trait]
impl ObjectWriter for MemoryWriter {
    async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(data);
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<PutResult> {
        let sha256 = sha256_hex(&self.buf);
        let size = self.buf.len() as u64;
        let uri = self.store.uri(&self.key);
        self.store
            .objects
            .locked()
            .insert(self.key, Stored::now(Bytes::from(self.buf)));
        Ok(PutResult { uri, size, sha256 })
    }

    async fn abort(self: Box<Self>) {}
}

#[async_trait]
impl Store for MemoryStore {
    fn name(&self) -> String {
        "memory".to_string()
    }

    fn uri(&self, key: &str) -> String {
        format!("memory:///{key}")
    }

    async fn get(&self, key: &str) -> Result<Option<GetResult>> {
        check_key(key)?;
        let got = self.objects.locked().get(key).map(|o| GetResult {
            revision: sha256_hex(&o.bytes),
            bytes: o.bytes.clone(),
        });
        if let Some(g) = &got {
            super::check_get_size(key, g.bytes.len() as u64, super::max_get_bytes())?;
        }
        Ok(got)
    }

    async fn open(&self, key: &str) -> Result<Option<ObjectReader>> {
        check_key(key)?;
        let bytes = self.objects.locked().get(key).map(|o| o.bytes.clone());
        Ok(bytes.map(|b| Box::pin(std::io::Cursor::new(b)) as ObjectReader))
    }

    async fn create(&self, key: &str) -> Result<Box<dyn ObjectWriter>> {
        check_key(key)?;
        Ok(Box::new(MemoryWriter {
            store: self.clone(),
            key: key.to_string(),
            buf: Vec::new(),
        }))
    }

    async fn put_cas(&self, key: &str, bytes: Bytes, expected: &str) -> Result<String> {
        check_key(key)?;
        let mut objects = self.objects.locked();
        let current = objects
            .get(key)
            .map(|o| sha256_hex(&o.bytes))
            .unwrap_or_default();
        if current != expected {
            return Err(ArchiveError::CasConflict {
                key: key.to_string(),
            });
        }
        let rev = sha256_hex(&bytes);
        objects.insert(key.to_string(), Stored::now(bytes));
        Ok(rev)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        check_key(key)?;
        self.objects.locked().remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let objects = self.objects.locked();
        Ok(objects
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| ObjectInfo {
                key: k.clone(),
                size: v.bytes.len() as u64,
                modified: Some(v.modified),
            })
            .collect())
    }
}
