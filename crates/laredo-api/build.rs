//! Compiles laredo's contract with protox (pure Rust: no `protoc` on the build machine), then
//! generates the prost messages, the tonic services and clients, and the proto3 JSON mapping.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/laredo/v1/query.proto", "proto/laredo/v1/oam.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = prost::Message::encode_to_vec(&fds);
    std::fs::write(out.join("laredo_descriptor.bin"), &descriptors)?;
    tonic_prost_build::configure()
        // The well-known types from pbjson-types: prost types with their proto3 JSON mapping.
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        // As Connect servers do: a newer client's fields are skipped, not an error.
        .ignore_unknown_fields()
        .build(&[".laredo.v1"])?;
    Ok(())
}
