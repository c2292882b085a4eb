#!/usr/bin/env bash
# The release as a user gets it: build it with scripts/release.sh (into DIR, default
# target/dist), then check the sums, the SBOM and the tarball, install the .deb with dpkg, check
# what landed where, run `tally check` on the installed configuration, verify the systemd units,
# and remove and purge the package. Run by scripts/test.sh after the benchmark gate, whose
# release build (same RUSTFLAGS: scripts/release-env.sh) left the dependencies compiled.
#
# No systemd runs as PID 1 on the test machine: the units are verified (`systemd-analyze verify`,
# `systemd-analyze security --offline`), and `tally serve` is started from the installed files
# as its unit's ExecStart says, by this script. Needs root (or sudo) for dpkg; refuses to
# run when a package named tally is already installed.
#   scripts/release_test.sh [DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd -P)"
cd "$root"
dist="${1:-target/dist}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

fail() { echo "release test: $*" >&2; exit 1; }

version="$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')"
name="tally-$version-$(rustc -vV | sed -n 's/^host: //p')"
scripts/release.sh --out "$dist"
dist="$(cd "$dist" && pwd -P)"
deb="$(ls "$dist"/tally_"$version"-*.deb)"

# Every artifact is in SHA256SUMS and matches it.
(cd "$dist" && sha256sum -c --strict SHA256SUMS)
[ "$(wc -l <"$dist/SHA256SUMS")" = 3 ] || fail "SHA256SUMS should list 3 files"

# The SBOM: CycloneDX JSON naming tally and the product's dependencies, not the test kit.
python3 - "$dist/tally-$version.cdx.json" "$version" <<'EOF'
import json, sys
bom = json.load(open(sys.argv[1]))
assert bom["bomFormat"] == "CycloneDX", bom.get("bomFormat")
assert bom["specVersion"] == "1.5", bom["specVersion"]
main = bom["metadata"]["component"]
assert (main["name"], main["version"]) == ("tally", sys.argv[2]), main
names = {c["name"] for c in bom.get("components", [])}
for crate in ["tally-counters", "tokio", "redis", "rdkafka", "rustls", "serde"]:
    assert crate in names, f"the SBOM does not name {crate}"
assert "tally-testkit" not in names, "the product's SBOM names the test kit"
assert all(c.get("purl", "").startswith("pkg:cargo/") for c in bom["components"]), "a component without a cargo purl"
print(f"release test: SBOM names tally {sys.argv[2]} and {len(names)} components")
EOF

# The tarball: the files the docs list, and the binary the .deb ships.
listing="$(tar -tzf "$dist/$name.tar.gz")"
for f in tally LICENSE README.md CHANGELOG.md config/tally.toml config/example.toml \
  dashboards/tally-stream.json prometheus/alerts.yml systemd/tally-run.service systemd/tally-serve.service; do
  grep -qx "$name/$f" <<<"$listing" || fail "the tarball has no $name/$f"
done
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
tar -xzf "$dist/$name.tar.gz" -C "$unpacked"
dpkg-deb -x "$deb" "$unpacked/deb"
cmp "$unpacked/$name/tally" "$unpacked/deb/usr/bin/tally" || fail "the tarball and the .deb ship different binaries"
# No path of the build machine in the binary (--remap-path-prefix).
cargo_home="$(cd "${CARGO_HOME:-$HOME/.cargo}" && pwd -P)"
for path in "$root" "$cargo_home"; do
  if grep -c --binary-files=text -F "$path/" "$unpacked/$name/tally" >/dev/null; then
    fail "the binary names the build machine's $path"
  fi
done

# Install, check, remove, purge.
if dpkg-query -W -f='${Status}' tally 2>/dev/null | grep -q 'installed'; then
  fail "a package named tally is installed here already; not touching it"
fi
trap '$SUDO dpkg --purge tally >/dev/null 2>&1 || true; rm -rf "$unpacked"' EXIT
$SUDO dpkg -i "$deb"
# The units are in /usr/lib/systemd/system, which is /lib/systemd/system on a merged /usr.
for f in /usr/bin/tally /etc/tally/tally.toml /lib/systemd/system/tally-run.service \
  /lib/systemd/system/tally-serve.service /usr/share/tally/prometheus/alerts.yml \
  /usr/share/doc/tally/examples/example.toml; do
  [ -f "$f" ] || fail "the package did not install $f"
done
dpkg-query -W -f='${Conffiles}\n' tally | grep -q '^ /etc/tally/tally.toml ' \
  || fail "/etc/tally/tally.toml is not a conffile"
/usr/bin/tally --version | grep -q "^tally $version " || fail "tally --version: $(/usr/bin/tally --version)"
/usr/bin/tally check --config /etc/tally/tally.toml >/dev/null
systemd-analyze verify /lib/systemd/system/tally-run.service /lib/systemd/system/tally-serve.service
for unit in tally-run tally-serve; do
  # Exposure at most 2.0 of 10 (the threshold counts tenths).
  systemd-analyze security --offline=yes --threshold=20 "/lib/systemd/system/$unit.service" | tail -1
done
echo "release test: units verified (no systemd as PID 1 here to start them)"

# `tally serve` started as its unit starts it (the installed ExecStart and configuration), at a
# Redis of its own on a free port: ready once Redis answers; SIGTERM stops it with exit 0.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
exec_start="$(sed -n 's/^ExecStart=//p' /lib/systemd/system/tally-serve.service)"
[ "${exec_start%% *}" = /usr/bin/tally ] || fail "tally-serve.service does not start /usr/bin/tally: $exec_start"
redis_port="$(free_port)"
http_port="$(free_port)"
redis_dir="$(mktemp -d)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$redis_dir" \
  --daemonize yes --pidfile "$redis_dir/redis.pid" >/dev/null
trap '$SUDO dpkg --purge tally >/dev/null 2>&1 || true; kill "$(cat "$redis_dir/redis.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$unpacked" "$redis_dir"' EXIT
TALLY_REDIS__URL="redis://127.0.0.1:$redis_port" TALLY_HTTP__LISTEN="127.0.0.1:$http_port" \
  $exec_start >"$redis_dir/serve.log" 2>&1 &
serve=$!
ready=""
for _ in $(seq 300); do
  if curl -fs --max-time 1 "http://127.0.0.1:$http_port/health/ready" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$serve" 2>/dev/null || break
  sleep 0.1
done
[ -n "$ready" ] || { cat "$redis_dir/serve.log" >&2; fail "the installed tally serve did not become ready"; }
kill -TERM "$serve"
wait "$serve" || { cat "$redis_dir/serve.log" >&2; fail "the installed tally serve did not exit 0 on SIGTERM"; }
echo "release test: the installed tally serve started, was ready, and stopped on SIGTERM"

# The operator's edit survives a reinstall and a removal; only a purge deletes it.
echo "# edited by the operator" | $SUDO tee -a /etc/tally/tally.toml >/dev/null
$SUDO dpkg -i "$deb" >/dev/null
grep -q '^# edited by the operator' /etc/tally/tally.toml || fail "a reinstall replaced the edited conffile"
$SUDO dpkg -r tally >/dev/null
[ ! -e /usr/bin/tally ] || fail "dpkg -r left /usr/bin/tally"
[ ! -e /lib/systemd/system/tally-run.service ] || fail "dpkg -r left the units"
grep -q '^# edited by the operator' /etc/tally/tally.toml || fail "dpkg -r removed the conffile"
$SUDO dpkg --purge tally >/dev/null
[ ! -e /etc/tally/tally.toml ] || fail "dpkg --purge left /etc/tally/tally.toml"
echo "release test: tally $version installed, checked, removed and purged"
