#!/usr/bin/env python3
"""Make cargo-cyclonedx's SBOM reproducible: its timestamp becomes the commit's
(SOURCE_DATE_EPOCH), its serial number a UUID derived from its content, and the build's own paths
fixed names, so that one commit always gives the same bytes.

    scripts/release_sbom.py IN.json OUT.json    (run by scripts/release.sh)
"""

import datetime
import hashlib
import json
import os
import sys
import uuid


def main() -> None:
    src, dest = sys.argv[1], sys.argv[2]
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
