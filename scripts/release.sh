#!/usr/bin/env bash
# Build tally's release artifacts, reproducibly, into one directory:
#   tally-<version>-<target>.tar.gz   the binary, LICENSE, README, CHANGELOG, the configuration as
#                                     shipped and the example one, dashboards, alert rules, units
#   tally_<version>-1_<arch>.deb      /usr/bin/tally, /etc/tally/tally.toml (a conffile), the
#                                     systemd units tally-run and tally-serve (cargo-deb)
#   tally-<version>.cdx.json          CycloneDX SBOM of the product's dependencies (cargo-cyclonedx)
#   SHA256SUMS                        `sha256sum -c SHA256SUMS` checks the three above
#
#   scripts/release.sh --out DIR                        build (or reuse) and package
#   scripts/release.sh --out DIR --check-reproducible   and build again from a copy of the sources
#                                                       at another path, with a fresh target
#                                                       directory: every artifact must be
#                                                       byte-identical (a second full build)
#
# The product is built without the `dev` feature (as the Dockerfile does). Dates come from the
# commit (SOURCE_DATE_EPOCH) and paths are remapped (scripts/release-env.sh), so the same commit
# gives the same bytes. Needs cargo-deb and cargo-cyclonedx (scripts/setup.sh installs them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd -P)"
cd "$root"

out="" check=false
while (($#)); do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --check-reproducible) check=true; shift ;;
    *) echo "release: unknown argument $1 (usage: scripts/release.sh --out DIR [--check-reproducible])" >&2; exit 64 ;;
  esac
done
[ -n "$out" ] || { echo "release: --out DIR is required" >&2; exit 64; }
for tool in deb cyclonedx; do
  cargo "$tool" --version >/dev/null 2>&1 \
    || { echo "release: cargo-$tool is missing; scripts/setup.sh installs it" >&2; exit 1; }
done

version="$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')"
triple="$(rustc -vV | sed -n 's/^host: //p')"
# The commit the binary reports: given explicitly, so a copy of the sources without .git (the
# reproducibility check) reports the same one.
TALLY_BUILD_COMMIT="${TALLY_BUILD_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
export TALLY_BUILD_COMMIT
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "release: warning: uncommitted changes; the binary reports commit $TALLY_BUILD_COMMIT" >&2
fi

# build SRC TARGET: the product binary of the sources in SRC, built in TARGET.
build() {
  (
    cd "$1"
    export CARGO_TARGET_DIR="$2"
    # shellcheck source=scripts/release-env.sh
    source "$1/scripts/release-env.sh"
    cargo build --release --locked --quiet --no-default-features --bin tally
  )
}

# package SRC TARGET DEST: the four artifacts of SRC's binary (built in TARGET) in DEST.
package() {
  local src="$1" target="$2" dest="$3"
  local name="tally-$version-$triple"
  local stage
  stage="$(mktemp -d)"
  mkdir -p "$dest" "$stage/$name"/{config,dashboards,prometheus,systemd}
  install -m 755 "$target/release/tally" "$stage/$name/tally"
  install -m 644 "$src"/{LICENSE,README.md,CHANGELOG.md} "$stage/$name/"
  install -m 644 "$src"/config/{tally.toml,example.toml} "$stage/$name/config/"
  install -m 644 "$src"/dashboards/*.json "$stage/$name/dashboards/"
  install -m 644 "$src/deploy/prometheus/alerts.yml" "$stage/$name/prometheus/"
  install -m 644 "$src"/deploy/systemd/*.service "$stage/$name/systemd/"
  # Sorted names, the commit's date, no owner: the same files give the same archive.
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    --format=gnu -C "$stage" -cf - "$name" | gzip -n -9 >"$dest/$name.tar.gz"
  rm -rf "$stage"
  (
    cd "$src"
    export CARGO_TARGET_DIR="$target"
    # The binary built above, as it is (already without debug information).
    cargo deb --no-build --no-strip --quiet -p tally --output "$dest/"
    cargo cyclonedx --format json --no-default-features --spec-version 1.5 --quiet \
      --override-filename "tally-sbom"
    cargo tree --locked -e normal,build --no-default-features -p tally --prefix none >"$target/tally-tree.txt"
  )
  python3 "$src/scripts/release_sbom.py" "$src/tally-sbom.json" "$target/tally-tree.txt" \
    "$dest/tally-$version.cdx.json"
  find "$src" -name 'tally-sbom.json' -not -path '*/target/*' -delete
  (cd "$dest" && sha256sum -- *.tar.gz *.deb *.cdx.json >SHA256SUMS)
}

source scripts/release-env.sh
mkdir -p "$out"
out="$(cd "$out" && pwd -P)"
rm -f "$out"/*.tar.gz "$out"/*.deb "$out"/*.cdx.json "$out"/SHA256SUMS
target="${CARGO_TARGET_DIR:-$root/target}"
build "$root" "$target"
package "$root" "$target" "$out"
echo "release: tally $version ($TALLY_BUILD_COMMIT) in $out" >&2
cat "$out/SHA256SUMS"

if $check; then
  copy="$(mktemp -d "${TMPDIR:-/tmp}/tally-reproducible.XXXXXX")"
  trap 'rm -rf "$copy"' EXIT
  # The tracked files as they are now, at another path, built in a target directory of their own.
  mkdir -p "$copy/src"
  git ls-files -z | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$copy/src"
  echo "release: second build in $copy (a full release build)" >&2
  build "$copy/src" "$copy/target"
  package "$copy/src" "$copy/target" "$copy/out"
  if cmp -s "$target/release/tally" "$copy/target/release/tally" \
    && cmp -s "$out/SHA256SUMS" "$copy/out/SHA256SUMS"; then
    echo "release: reproducible: both builds gave byte-identical artifacts" >&2
  else
    echo "release: NOT reproducible: the two builds differ" >&2
    sha256sum "$target/release/tally" "$copy/target/release/tally" >&2
    diff "$out/SHA256SUMS" "$copy/out/SHA256SUMS" >&2 || true
    exit 1
  fi
fi
