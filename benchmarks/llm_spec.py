"""Moved: the framework's `spec` suite (benchmarks/suites/spec.py);
this path takes the same options."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["run", "spec", *sys.argv[1:]]))
