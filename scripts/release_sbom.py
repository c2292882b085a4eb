#!/usr/bin/env python3
"""The product's SBOM from cargo-cyclonedx's, reproducible.

cargo-cyclonedx resolves the whole workspace, so the benchmark's crates and the `dev` feature's
test kit come in; only the components of the product's own graph are kept, as
`cargo tree -e normal,build --no-default-features -p tally --prefix none` lists them (TREE).
Then its timestamp becomes the commit's (SOURCE_DATE_EPOCH), its serial number a UUID derived
from its content, and the build's own paths fixed names: one commit always gives the same bytes.

    scripts/release_sbom.py IN.json TREE OUT.json    (run by scripts/release.sh)
"""

import datetime
import hashlib
import json
import os
import sys
import uuid


def product_crates(tree: str) -> set[tuple[str, str]]:
    """(name, version) of every crate in `cargo tree --prefix none` output ("tokio v1.54.1")."""
    crates = set()
    with open(tree, encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if len(words) >= 2 and words[1].startswith("v"):
                crates.add((words[0], words[1][1:]))
    if not crates:
        sys.exit(f"release_sbom: no crate in {tree}")
    return crates


def keep_only(bom: dict, crates: set[tuple[str, str]]) -> None:
    """Drop the components (and their dependency entries) that are not in `crates`."""
    kept = [c for c in bom.get("components", []) if (c["name"], c["version"]) in crates]
    refs = {c["bom-ref"] for c in kept} | {bom["metadata"]["component"]["bom-ref"]}
    bom["components"] = kept
    deps = [d for d in bom.get("dependencies", []) if d["ref"] in refs]
    for d in deps:
        d["dependsOn"] = [r for r in d.get("dependsOn", []) if r in refs]
    bom["dependencies"] = deps


def main() -> None:
    src, tree, dest = sys.argv[1], sys.argv[2], sys.argv[3]
    root = os.path.dirname(os.path.abspath(src))
    with open(src, encoding="utf-8") as f:
        text = f.read()
    # Paths of the checkout and of cargo's home (path dependencies, the registry) as the binary
    # names them (scripts/release-env.sh).
    cargo_home = os.path.realpath(os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo")))
    text = text.replace(root, "/build/tally").replace(cargo_home, "/cargo")
    bom = json.loads(text)
    if bom.get("bomFormat") != "CycloneDX":
        sys.exit(f"release_sbom: {src} is not a CycloneDX document")
    keep_only(bom, product_crates(tree))
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    when = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    bom.setdefault("metadata", {})["timestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    bom.pop("serialNumber", None)
    digest = hashlib.sha256(json.dumps(bom, sort_keys=True).encode()).hexdigest()
    bom["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, digest)}"
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(bom, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
