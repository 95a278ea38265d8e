//! The PostgreSQL source: schema discovery, consistent baseline, logical replication.
