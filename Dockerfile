# The one `larch` binary: `larch operator`, and the `larch export` / `larch engine` pods it runs.
#   docker build -t larch:dev .
FROM rust:1.95-bookworm AS build
WORKDIR /src
# cmake/clang: C parts of crypto and compression crates, and libclang for pg_query's bindgen
# (PostgreSQL's parser, for row filters); protobuf-compiler for prost if needed.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang pkg-config protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin larch \
 && install -D -m 0755 target/release/larch /out/larch

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/larch /usr/local/bin/larch
# distroless "nonroot" is UID/GID 65532; generated pods run as the same user.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/larch"]
CMD ["--help"]
