//! S3 store (aws-sdk-s3). See `S3Config`.
