#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/ for a bounded time each, under a memory cap
# and a per-input time limit: a panic, an out-of-memory, a slow input or a leak of the cap fails
# the run, and the input is left in fuzz/artifacts/<target>/ (replay it with
# `cargo fuzz run <target> <file>`). Starts from the committed seeds and regressions, plus a
# generated corpus in fuzz/corpus/<target>/ when one exists (kept between runs, not in git).
#
#   scripts/fuzz.sh [--seconds N] [--rss-mb M] [--seed S] [TARGET ...]
#
# Defaults: 20 s each, 512 MB, seed 1. A fixed seed makes a run repeatable: the same commit
# explores the same inputs in the same order, so a finding in CI is found again here and a
# green run is not luck. `--seed 0` lets libFuzzer pick one (for exploring, not for gating).
#
# cargo-fuzz passes `-Z` flags; RUSTC_BOOTSTRAP=1 lets the stable compiler take them (fuzz/README.md).
# No sanitizer: the targets run safe Rust, and libFuzzer's own RSS limit and timeouts are what
# the run checks; the build takes about half the time an ASan build does.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=20
rss_mb=512
seed=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --rss-mb) rss_mb="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(ls fuzz/fuzz_targets | sed 's/\.rs$//')
fi
export RUSTC_BOOTSTRAP=1
# Instrumented builds never share artifacts with normal ones.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
# Line tables are enough for a finding's backtrace, and build faster than fuller debug info.
export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
cargo fuzz build --sanitizer none
for t in "${targets[@]}"; do
  work="fuzz/work/$t"
  mkdir -p "$work"
  dirs=("$work")
  for d in corpus seeds regressions; do
    [ -d "fuzz/$d/$t" ] && dirs+=("fuzz/$d/$t")
  done
  args=(-max_total_time="$seconds" -rss_limit_mb="$rss_mb" -malloc_limit_mb="$rss_mb" -timeout=10
        -print_final_stats=1 -seed="$seed")
  [ -f "fuzz/dict/$t.dict" ] && args+=(-dict="fuzz/dict/$t.dict")
  echo "fuzz: $t for ${seconds} s (${dirs[*]})" >&2
  log="$work/run.log"
  if ! cargo fuzz run --sanitizer none "$t" "${dirs[@]}" -- "${args[@]}" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz: target $t failed; its input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" | tr '\n' ' ' >&2
  echo >&2
done
