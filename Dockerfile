# The one `larch` binary: `larch operator`, and the `larch export` / `larch engine` pods it runs.
#
#   docker build -t larch:dev .                  build the binary in the image (stage `build`)
#   docker build --target prebuilt -t larch:dev CONTEXT
#                                                a binary built outside: CONTEXT holds only
#                                                larch-<TARGETARCH> (larch-amd64, larch-arm64);
#                                                what scripts/image.sh and the release workflow do
#
# The bases are build arguments so that a machine without a registry can substitute them
# (scripts/image.sh builds an equivalent of distroless/cc-debian12:nonroot from Debian packages):
#   --build-arg BUILD_IMAGE=...   --build-arg RUNTIME_IMAGE=...
ARG BUILD_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
# cmake/clang: C parts of crypto and compression crates, and libclang for pg_query's bindgen
# (PostgreSQL's parser, for row filters); protobuf-compiler for prost if needed.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang pkg-config protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
# The context is what .dockerignore lets through: Cargo.toml, Cargo.lock, build.rs, src/ and
# crates/ (the workspace's members).
COPY . ./
# `larch --version` names the commit: docker build --build-arg LARCH_GIT_COMMIT=$(git rev-parse HEAD)
ARG LARCH_GIT_COMMIT=""
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin larch \
 && install -D -m 0755 target/release/larch /out/larch

# A binary built outside (release binaries, scripts/image.sh): no compiler in the build.
FROM ${RUNTIME_IMAGE} AS prebuilt
ARG TARGETARCH
COPY --chmod=0755 larch-${TARGETARCH} /usr/local/bin/larch
# distroless "nonroot" is UID/GID 65532; generated pods run as the same user.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/larch"]
CMD ["--help"]

# The default target: the binary built in the `build` stage.
FROM ${RUNTIME_IMAGE}
COPY --from=build /out/larch /usr/local/bin/larch
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/larch"]
CMD ["--help"]
