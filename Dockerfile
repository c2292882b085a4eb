# syntax=docker/dockerfile:1
# tally: multi-stage build. The builder compiles librdkafka from source (the rdkafka crate does),
# which needs cmake; OpenSSL (Kafka SSL/SASL, rediss://) links against the system libssl.
# The runtime image holds the binary, the shared libraries it links to, and curl for the
# healthcheck that docker-compose.yml defines. The product is built without the `dev` feature,
# so the image's `tally` has no test kit and no demo, mock-broker or produce command; the compose
# stack's load generator builds its own image with TALLY_FEATURES=dev to get `tally produce`.

# At least the highest rust-version among the locked dependencies (cargo refuses older).
ARG RUST_VERSION=1.88

FROM rust:${RUST_VERSION}-bookworm AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake libssl-dev pkg-config zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
# Cargo features on top of the product's (none): "dev" adds the local tooling commands.
ARG TALLY_FEATURES=""
# The git commit `tally version` and tally_build_info report (.git is not in the build context):
# docker build --build-arg TALLY_BUILD_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG TALLY_BUILD_COMMIT=""
WORKDIR /src
COPY . .
# Cache mounts keep the crate registry and compiled dependencies between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    TALLY_BUILD_COMMIT="${TALLY_BUILD_COMMIT}" cargo build --release --locked --no-default-features --features "${TALLY_FEATURES}" --bin tally \
    && cp target/release/tally /usr/local/bin/tally

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl libssl3 zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --shell /usr/sbin/nologin tally
COPY --from=builder /usr/local/bin/tally /usr/local/bin/tally
COPY config/tally.toml /etc/tally/tally.toml
USER tally
# /metrics and /health: listen on all interfaces inside the container.
ENV TALLY_HTTP__LISTEN=0.0.0.0:9100
EXPOSE 9100
ENTRYPOINT ["/usr/local/bin/tally"]
CMD ["run", "--config", "/etc/tally/tally.toml"]
