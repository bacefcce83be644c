"""The stack tests run only under `make test-stack` (CODEYARD_STACK_TEST=1): they build images and bring
the whole stack up, which does not fit the default suite's time."""

import os

collect_ignore_glob = [] if os.environ.get("CODEYARD_STACK_TEST") == "1" else ["test_*.py"]
