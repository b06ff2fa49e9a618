"""``make bench``: the MERGE benchmark of ``bench/merge`` (see its docstring for the workloads, peers and flags)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.merge.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
