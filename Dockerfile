# Flotilla's container image. Not built in CI: no container engine runs
# there. Build with: docker build -t ghcr.io/example/flotilla:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY deploy deploy
RUN cargo build --release --locked --bin flotilla

# glibc and CA roots only; runs as uid 65532 with a read-only root filesystem.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/flotilla /usr/local/bin/flotilla
USER 65532:65532
EXPOSE 50051 8080
ENTRYPOINT ["/usr/local/bin/flotilla"]
