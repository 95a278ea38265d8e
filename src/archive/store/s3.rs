//! S3 store (aws-sdk-s3). Being built on its own branch; this placeholder keeps the tree compiling.

use super::spec::StoreSpec;
use crate::archive::error::{ArchiveError, Result};

#[derive(Debug)]
pub struct S3Store;

impl S3Store {
    pub async fn from_spec(_spec: &StoreSpec) -> Result<S3Store> {
        Err(ArchiveError::Invalid(
            "the s3 store is not available in this build".into(),
        ))
    }
}

#[async_trait::async_trait]
impl super::Store for S3Store {
    fn name(&self) -> String {
        unreachable!()
    }
    fn uri(&self, _key: &str) -> String {
        unreachable!()
    }
    async fn get(&self, _key: &str) -> Result<Option<super::GetResult>> {
        unreachable!()
    }
    async fn open(&self, _key: &str) -> Result<Option<super::ObjectReader>> {
        unreachable!()
    }
    async fn create(&self, _key: &str) -> Result<Box<dyn super::ObjectWriter>> {
        unreachable!()
    }
    async fn put_cas(&self, _key: &str, _bytes: bytes::Bytes, _expected: &str) -> Result<String> {
        unreachable!()
    }
    async fn delete(&self, _key: &str) -> Result<()> {
        unreachable!()
    }
    async fn list(&self, _prefix: &str) -> Result<Vec<super::ObjectInfo>> {
        unreachable!()
    }
}
