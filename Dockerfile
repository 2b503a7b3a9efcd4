# Flotilla's container image for those with a container engine. Not built in
# CI (no engine runs there): `make image` writes the same image without one.
# Build with: docker build -t ghcr.io/example/flotilla:0.1.0 .
# The binary is built for x86_64 (static glibc), on any host.
FROM --platform=linux/amd64 rust:1.95-bookworm AS build
# etcd-client's build script compiles its protos with the system protoc.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY deploy deploy
COPY integration/image integration/image
# The build `make image` runs: static, paths remapped, so both images carry
# one binary (given the same toolchain and libc.a).
RUN integration/image --binary-only

# CA roots and the nonroot user only: the binary is static. It runs as uid
# 65532 with a read-only root filesystem.
FROM --platform=linux/amd64 gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/flotilla /usr/local/bin/flotilla
USER 65532:65532
EXPOSE 50051 8080 8443
ENTRYPOINT ["/usr/local/bin/flotilla"]
