"""The gate's same-run A/B: the baseline commit's engine against this tree's, on the same model and
prompts, alternating in two worker processes, so that the machine's speed at the moment of the run
cancels out.

Why: the engine/Transformers ratio the gate stores drifts with the host (on one 2-core cloud host the
same commit read 1.20 to 1.71 over a day: under contention the engine loses more than Transformers),
more than the 20% slowdown the gate must catch. Two builds of the same engine, measured round by round
in the same minutes, do not drift apart. The baseline file names its commit; its `llm_engine/` comes
out of git (`git archive`) into a scratch folder that the baseline worker imports ahead of this tree.
Without that commit (a shallow clone) or a worker, the gate falls back to the stored ratios.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from benchmarks.framework import results

REPO = results.REPO


class ABUnavailable(Exception):
    """The same-run A/B cannot run here (the reason is the message)."""


def serve(folder: str, prompts_path: str, slowdown: float) -> None:
    """A worker's loop: load the engine from the first folder on sys.path, answer each "go" line on
    stdin with one timed round as a JSON line (tokens/s, mean TTFT, the output tokens)."""
    import torch

    import llm_engine
    from benchmarks.framework.gate import engine_round, open_engine
    from benchmarks.framework.targets import inject_slowdown

    torch.set_num_threads(1)
    prompts = json.loads(Path(prompts_path).read_text())
    llm = open_engine(Path(folder))
    if slowdown:
        inject_slowdown(slowdown)
    engine_round(llm, prompts)  # warm-up
    print(json.dumps({"ready": str(Path(llm_engine.__file__).parent)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            return
        tok_s, ttft, outs = engine_round(llm, prompts)
        print(json.dumps({"tok_s": tok_s, "ttft": ttft, "outputs": outs}), flush=True)


class Worker:
    """One engine in its own process, importing `llm_engine` from `tree` first."""

    def __init__(self, name: str, tree: Path, folder: Path, prompts_path: Path, slowdown: float, log: Path) -> None:
        self.name = name
        code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
                "from benchmarks.framework.gate_ab import serve; serve(*sys.argv[3:5], float(sys.argv[5]))")
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(tree), str(REPO), str(folder), str(prompts_path), repr(slowdown)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=folder)
        ready = self._answer()
        if Path(ready["ready"]).resolve() != (tree / "llm_engine").resolve():
            raise ABUnavailable(f"the {name} worker imported llm_engine from {ready['ready']}, not {tree}")

    def _answer(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            tail = self.log.read_text()[-1500:]
            raise ABUnavailable(f"the {self.name} engine worker stopped: {tail}")
        return json.loads(line)

    def round(self) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        with suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def extract_engine(commit: str, into: Path) -> Path:
    """`llm_engine/` as it was at `commit`, written under `into`; ABUnavailable if git lacks the commit."""
    found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True)
    if found.returncode != 0:
        raise ABUnavailable(f"commit {commit[:10]} is not in this clone (shallow?)")
    archive = into / "engine.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), commit, "llm_engine"], cwd=REPO,
                   check=True, capture_output=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


@contextmanager
def workers(commit: str, folder: Path, prompts: list[list[int]], slowdown: float,
            log: Callable[[str], None]) -> Iterator[tuple[Worker, Worker]]:
    """(baseline, current) engine workers over the model in `folder`; only the current one is slowed."""
    with tempfile.TemporaryDirectory(prefix="codeyard-gate-ab-") as tmp:
        scratch = Path(tmp)
        prompts_path = scratch / "prompts.json"
        prompts_path.write_text(json.dumps(prompts))
        log(f"A/B: starting the engine of baseline commit {commit[:10]} and this tree's "
            "(building the baseline's kernels if their sources differ)")
        started: list[Worker] = []
        try:
            started.append(Worker("baseline", extract_engine(commit, scratch), folder, prompts_path, 0.0,
                                  scratch / "baseline.log"))
            started.append(Worker("current", REPO, folder, prompts_path, slowdown, scratch / "current.log"))
            yield started[0], started[1]
        finally:
            for worker in started:
                worker.close()


def measure(result: dict, commit: str, folder: Path, prompts: list[list[int]], repeats: int, rounds: int,
            slowdown: float, log: Callable[[str], None]) -> None:
    """Add the A/B's repeats to `result` under "baseline commit" and "current": each repeat is the best
    of `rounds` alternating rounds (the order flips every round)."""
    with workers(commit, folder, prompts, slowdown, log) as (base, current):
        for repeat in range(repeats):
            pairs = [(base, current) if (repeat + r) % 2 else (current, base) for r in range(rounds)]
            times: dict[str, list[dict]] = {"baseline": [], "current": []}
            for first, second in pairs:
                times[first.name].append(first.round())
                times[second.name].append(second.round())
            for name, runs in times.items():
                figures = {"output_tokens_per_s": round(max(r["tok_s"] for r in runs), 1),
                           "ttft_ms": round(min(r["ttft"] for r in runs) * 1000, 2)}
                results.add_repeat(result, f"engine A/B: {name}", figures)
            cur, old = (result["figures"][f"engine A/B: {n}"]["runs"][-1] for n in ("current", "baseline"))
            log(f"A/B repeat {repeat + 1}: current {cur['output_tokens_per_s']:7.1f} tok/s, baseline commit "
                f"{old['output_tokens_per_s']:7.1f} tok/s; TTFT {cur['ttft_ms']:.1f} vs {old['ttft_ms']:.1f} ms")


def verdicts(result: dict, alpha: float, min_change: float) -> list[results.Verdict]:
    """The current engine's tokens/s and TTFT against the baseline commit's, from the same run."""
    figures = result["figures"]
    base, cur = figures["engine A/B: baseline"]["runs"], figures["engine A/B: current"]["runs"]
    return [results.compare_figure("engine vs baseline commit", figure, [r[figure] for r in base],
                                   [r[figure] for r in cur], alpha, min_change, higher)
            for figure, higher in (("output_tokens_per_s", True), ("ttft_ms", False))]
