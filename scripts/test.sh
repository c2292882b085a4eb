#!/usr/bin/env bash
# Set up (when needed) and run every test: unit, property and integration tests against a real
# redis-server and a real Kafka-protocol broker (librdkafka's mock cluster), plus lint checks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast
else
  cargo test --no-fail-fast
fi
