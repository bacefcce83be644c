"""Request ids without a system call per request.

Every /v1 and /v2 request (and each gRPC one) is named for the engine (`cmpl-...`, `v2-...`). They
were `uuid.uuid4().hex`: 16 bytes from `os.urandom` (a getrandom system call) and a UUID object,
~1.6 us in a hot loop but 30-37 us for an isolated request, whose code and data the caches no
longer hold (the API process sleeps between requests; measured with a 0.25 s gap, load 2-3), on
the way to `generate`. An id only has to be unique among the requests a server has in flight (the
engine refuses a duplicate) and not guessable across servers and restarts (logs, the disaggregated
proxy's instances): a random part drawn once per process, then a counter, gives both.
"""

from __future__ import annotations

import itertools
import os

_process: tuple[int, str] | None = None  # (pid, random hex drawn in that process)
_counter = itertools.count()


def new_request_id(prefix: str) -> str:
    """`prefix-` then 32 hex digits: 16 random for this process, then a 64-bit counter."""
    global _process
    if _process is None or _process[0] != os.getpid():  # a forked child draws its own
        _process = (os.getpid(), os.urandom(8).hex())
    return f"{prefix}-{_process[1]}{next(_counter):016x}"
