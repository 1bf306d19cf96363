"""Write deploy/constraints.txt, the image's lock: every package the runtime and the `gpu` extra
resolve to, pinned (`make lock`; deploy/Dockerfile installs from it before it copies the code).

It reads the report of `pip install --dry-run --ignore-installed --report FILE '.[gpu]'`, which
resolves against the package index without installing anything. tests/unit/test_packaging.py
checks the lock still satisfies pyproject.toml's ranges.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "deploy" / "constraints.txt"
HEADER = """\
# The image's lock: what pyproject.toml's runtime dependencies and its `gpu` extra resolved to
# for Python 3.11 on Linux x86-64 (deploy/Dockerfile's base). Written by `make lock`
# (scripts/write_lock.py) from pip's resolution; do not edit by hand.
"""


def main(report: str) -> int:
    installs = json.loads(Path(report).read_text())["install"]
    pins = sorted(
        (i["metadata"]["name"].lower().replace("_", "-"), i["metadata"]["version"])
        for i in installs
        if not i.get("is_direct")
    )
    LOCK.write_text(HEADER + "".join(f"{name}=={version}\n" for name, version in pins))
    print(f"{len(pins)} pins in {LOCK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
