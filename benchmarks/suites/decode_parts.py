"""Where a batched run's CPU time goes, by part of the model (issue 16's breakdown).

`DecodeParts(llm, batch)` wraps, while it is entered, the forward of the decoder layers and their
linear layers, attention modules (KV write and the paged decode kernel), RMSNorms, SiLU and
rotary embeddings, and the runner's execute, LM head and sampling, and sums each one's thread CPU
time over two kinds of runner step: "decode", the steps in which exactly `batch` sequences all
decode one token, and "prompt", the steps with a prompt chunk (some sequence takes more than one
token). `parts()` gives milliseconds per decode step, `parts("prompt", per_step=False)` the
prompt phase's milliseconds in all (`steps[phase]` counts the steps): the step (execute: inputs, metadata, layers, LM head), linear
layers, attention, norm/act/rotary, the layers' own Python (a layer's time less its parts), the
LM head, the rest of the step, and sampling (which runs after execute; a step that the fused
decode stack runs, layers/decode_stack.py, bypasses the layers' modules: it is all in the step's
rest). Thread CPU, so waiting for
a core on a shared machine is not in it; the wrappers themselves add a few microseconds per call,
so time the figures that matter without it, and read these as shares.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

PARTS = ("linear", "attention", "norm/act/rotary")
PHASES = ("decode", "prompt")


class DecodeParts:
    def __init__(self, llm: Any, batch: int) -> None:
        self.llm, self.batch = llm, batch
        self.totals = {phase: dict.fromkeys(("step", "layers", *PARTS, "lm head", "sample"), 0.0)
                       for phase in PHASES}
        self.steps = dict.fromkeys(PHASES, 0)
        self._counting: dict[str, float] | None = None  # the totals of the phase being counted
        self._restore: list[tuple[object, str, object | None]] = []  # (owner, attribute, its own value or None)

    def __enter__(self) -> DecodeParts:
        from llm_engine.layers.activation import SiluAndMul
        from llm_engine.layers.attention import Attention
        from llm_engine.layers.linear import LinearBase
        from llm_engine.layers.norm import RMSNorm
        from llm_engine.layers.rotary import RotaryEmbedding

        runner = self.llm.engine.model_runner
        kinds = ((LinearBase, "linear"), (Attention, "attention"), (RMSNorm, "norm/act/rotary"),
                 (SiluAndMul, "norm/act/rotary"), (RotaryEmbedding, "norm/act/rotary"))
        layers = runner.model.model.layers
        for module in layers.modules():
            part = next((name for cls, name in kinds if isinstance(module, cls)), None)
            if part is not None:
                self._wrap(module, "forward", part)
        for layer in layers:
            self._wrap(layer, "forward", "layers")
        self._wrap(runner.model, "compute_logits", "lm head")
        self._wrap(runner, "sample", "sample")
        execute = self._replace(runner, "execute")

        def counted_step(scheduled: Any, block_copies: Any) -> Any:
            phase = self.phase_of(scheduled)
            self._counting = None if phase is None else self.totals[phase]
            start = time.thread_time()
            try:
                return execute(scheduled, block_copies)
            finally:
                if phase is not None:
                    self.totals[phase]["step"] += time.thread_time() - start
                    self.steps[phase] += 1
        runner.execute = counted_step
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attribute, own in reversed(self._restore):
            if own is None:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, own)
        self._restore.clear()
        self._counting = None

    def phase_of(self, scheduled: Any) -> str | None:
        """"prompt" for a step with a prompt chunk, "decode" for one of `batch` one-token decodes."""
        if any(num_new > 1 for _, num_new in scheduled):
            return "prompt"
        return "decode" if len(scheduled) == self.batch else None

    def _replace(self, owner: object, attribute: str) -> Callable[..., Any]:
        """The current callable, noting how to put it back (an instance's own attribute, e.g.
        another clock's wrapper, is set again; a method is uncovered)."""
        self._restore.append((owner, attribute, vars(owner).get(attribute)))
        function: Callable[..., Any] = getattr(owner, attribute)
        return function

    def _wrap(self, owner: object, attribute: str, part: str) -> None:
        function = self._replace(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            totals = self._counting
            if totals is None:
                return function(*args, **kwargs)
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                totals[part] += time.thread_time() - start
        setattr(owner, attribute, timed)

    def parts(self, phase: str = "decode", per_step: bool = True) -> dict[str, float]:
        """CPU milliseconds per counted step of `phase` (or in all), by part (empty when no step was
        counted)."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
        steps = self.steps[phase]
        if not steps:
            return {}
        t = {name: seconds * 1000 / (steps if per_step else 1) for name, seconds in self.totals[phase].items()}
        return {"step": t["step"], **{name: t[name] for name in PARTS},
                "layer glue": t["layers"] - sum(t[name] for name in PARTS), "lm head": t["lm head"],
                "step rest": t["step"] - t["layers"] - t["lm head"], "sample": t["sample"]}
