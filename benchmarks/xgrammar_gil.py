"""Does xgrammar's mask fill release the GIL? (issue 18: masks on another thread during the forward)

    .venv/bin/python benchmarks/xgrammar_gil.py

With a switch interval of 100 s the GIL changes hands only when a thread gives it up. A worker
calls op() for about half a second of calls, counting; the main thread, once it gets the GIL
back, reads the count. A call that keeps the GIL lets the worker finish every call first (always,
whatever the load); a call that releases it lets the main thread in as soon as the OS runs it
(on a loaded host the worker may take the free GIL back a few times first)."""
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np
import xgrammar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.__main__ import load_tokenizer  # noqa: E402
from benchmarks.suites.structured import SCHEMA  # noqa: E402
from benchmarks.suites.throughput import find_smollm2_gguf  # noqa: E402
from llm_engine.structured_outputs import GrammarCompiler, StructuredOutputsParams  # noqa: E402

tok = load_tokenizer(str(find_smollm2_gguf()))
g = GrammarCompiler(tok, len(tok), {tok.eos_token_id}).compile(StructuredOutputsParams(json=SCHEMA))
st = g.new_state()
bm = xgrammar.allocate_token_bitmask(1, len(tok))
a = np.random.rand(300, 300)
held = list(range(4000)); random.shuffle(held)
ops = {"sorted (keeps the GIL)": lambda: sorted(held), "numpy matmul (releases it)": lambda: a @ a,
       "xgrammar fill": lambda: st.fill(bm, 0)}
sys.setswitchinterval(100.0)
done = [0]


def work(op, calls: int) -> None:
    for _ in range(calls):
        op()
        done[0] += 1


for name, op in ops.items():
    start = time.perf_counter()
    for _ in range(20):
        op()
    calls = max(int(0.5 / ((time.perf_counter() - start) / 20)), 20)
    done[0] = 0
    thread = threading.Thread(target=work, args=(op, calls))
    thread.start()  # the main thread waits for it to start (gives up the GIL), then wants it back
    seen = done[0]
    thread.join()
    verdict = "kept the GIL" if seen == calls else "released it"
    print(f"{name:28} worker calls done when the main thread got the GIL back: {seen}/{calls} ({verdict})",
          flush=True)
