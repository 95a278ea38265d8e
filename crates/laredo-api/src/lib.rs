//! laredo's gRPC contract as larch speaks it: the `laredo.v1` query and OAM services
//! (messages, tonic servers and clients, proto3 JSON through serde).

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/laredo.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/laredo.v1.serde.rs"));
}

pub mod connect;

pub use pbjson_types;
pub use tonic;
