#!/usr/bin/env bash
# Set up what the demo needs (when missing: redis-server and the build tools, not the tests'
# set-up), build, and run the demo: in-process Kafka broker, synthetic events,
# a local redis-server, /metrics on 127.0.0.1:9100 and a live view of the top counters.
# It runs the example configuration, config/example.toml, which every example of the README,
# the book and `tally <command> --help` uses: after the demo each answers as shown. Its
# redis-server listens on that file's 127.0.0.1:6379 when the port is free.
# Extra arguments go to `tally demo` (e.g. --rate 50000 --duration 60s).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo
exec cargo run --release --quiet -- demo --config config/example.toml "$@"
