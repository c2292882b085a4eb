#!/usr/bin/env bash
# tally under steady mixed load for DURATION (default 30m), not part of CI:
#   scripts/soak.sh 30m [more tally-soak options, e.g. --broker tansu, --rate 1000]
# Stream events with 1-minute windows (librdkafka's mock broker, or tansu with --broker tansu:
# the mock slows down as its in-memory log grows) and request-path traffic (hits, rate-limit
# decisions); every 10 s tally's RSS and open files and Redis' clients, memory and key count go to
# target/soak/samples.csv. The verdict (target/soak/verdict.csv): each series' slope over the last
# two thirds within its bound, and every live key equal to the truth. Exit 0 only then.
# With python3 and matplotlib (pip install matplotlib), target/soak/soak.png is drawn from the
# samples (docs/soak.png is the 30-minute run's). SOAK_OUT sets another directory.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-30m}"
shift || true
cargo build --quiet --workspace --bins
out="${SOAK_OUT:-target/soak}"
status=0
target/debug/tally-soak --duration "$duration" --out "$out" "$@" || status=$?
if python3 -c "import matplotlib" 2>/dev/null; then
  python3 scripts/soak_plot.py "$out/samples.csv" "$out/soak.png"
else
  echo "soak: no matplotlib (pip install matplotlib): no plot" >&2
fi
exit "$status"
