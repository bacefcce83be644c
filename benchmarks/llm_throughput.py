"""Moved: the framework's `throughput` suite (benchmarks/suites/throughput.py). This path stays so
the docs and notes that name it keep working; it takes the same options, `--json` included:

    .venv/bin/python benchmarks/llm_throughput.py --single-stream --json out.json
    # is: python -m benchmarks run throughput --single-stream --out out.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["run", "throughput", *sys.argv[1:]]))
