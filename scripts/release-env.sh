# Sourced (not run) by scripts/release.sh and scripts/test.sh: the environment of a reproducible
# release build. Both builds must see the same RUSTFLAGS, or cargo rebuilds every dependency: the
# benchmark gate's release build in scripts/test.sh then leaves the compiled dependencies the
# package build of scripts/release.sh reuses.
#   SOURCE_DATE_EPOCH  the commit's time: the dates in the tarball and the .deb (not the clock)
#   RUSTFLAGS          --remap-path-prefix: the build's own paths (checkout, cargo home, target
#                      directory) become fixed names in the binary's panic locations
# Respects a SOURCE_DATE_EPOCH or CARGO_TARGET_DIR already set.
release_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
release_cargo_home="$(cd "${CARGO_HOME:-$HOME/.cargo}" && pwd -P)"
release_target="${CARGO_TARGET_DIR:-$release_root/target}"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git -C "$release_root" log -1 --format=%ct 2>/dev/null || echo 0)"
fi
export SOURCE_DATE_EPOCH
# The last prefix that matches wins: the target directory (often inside the checkout) comes last.
RUSTFLAGS="--remap-path-prefix=$release_cargo_home=/cargo --remap-path-prefix=$release_root=/build/tally --remap-path-prefix=$release_target=/build/target"
export RUSTFLAGS
