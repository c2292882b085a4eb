#!/usr/bin/env bash
# Set up (when needed) and run every test: unit, property and integration tests against a real
# redis-server and a real Kafka-protocol broker (librdkafka's mock cluster), plus lint checks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The tree is the map, read from the parsed source (crates/tally-layers): no import cycle between
# folders, none upward between stages, no file over 500 lines, no owner struct over 12 fields, the
# budgets of crates/tally-layers/allow.toml (functions, type names, impls), the Layout of lib.rs
# and the layout page true (the check's own self-test first: each fault planted in a small tree).
cargo run --quiet -p tally-layers -- --self-test
cargo run --quiet -p tally-layers
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The product without the dev tooling (feature `dev`): it compiles (clippy checks it without
# building, so target/debug/tally stays the full binary the tests run), and has no test kit in its
# graph.
cargo clippy --no-default-features -p tally --quiet -- -D warnings
if cargo tree -e normal --no-default-features -p tally | grep -q tally-testkit; then
  echo "the product (--no-default-features) depends on tally-testkit" >&2
  exit 1
fi
# The product's dependencies: licenses allowed, crates.io only, no new duplicate versions
# (deny.toml says why each remaining one is there). Advisories need GitHub: not run here.
cargo deny --no-default-features --exclude-dev --locked --log-level error check bans licenses sources
# The benchmark gate: tally end to end against a bare consumer of the same topic, both from
# process start, alternating rounds (crates/tally-bench/src/gate.rs; about 10 minutes to build
# in release on 2 cores, 1-2 to run). It fails when the medians cross the floors below, set
# from the spread measured on this 2-core machine (docs/guide/17-benchmark.md says how).
# Built with the release's RUSTFLAGS (scripts/release-env.sh, in a subshell: the debug builds
# below keep theirs), so the release test after it reuses the compiled dependencies.
(source scripts/release-env.sh && cargo build --release --quiet -p tally-bench --bin tally-bench)
target/release/tally-bench gate --rounds 3 --min-rate-ratio 0.5 --max-cpu-ratio 2.0
# The release as a user gets it: scripts/release.sh's tarball, SBOM and .deb, checked, the .deb
# installed with dpkg, its units verified, then purged (scripts/release_test.sh).
scripts/release_test.sh target/dist
# Fuzzing: every target in fuzz/ for 20 s from its seeds, under a 512 MB memory cap and a 10 s
# limit per input (scripts/fuzz.sh; the instrumented build is its own, in target/fuzz).
scripts/fuzz.sh --seconds 20 --rss-mb 512
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast
else
  cargo test --no-fail-fast
fi
# Doctests (nextest runs none): the tally-counters README's example compiles against the API.
cargo test --doc -p tally-counters --quiet
# The library as crates.io would get it: packaged alone (the unpublished test kit left out) and
# built from the package (about a minute).
cargo package -p tally-counters --quiet
