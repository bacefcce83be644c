"""The measured runtime options of a built engine (`codeyard llm tune ENGINE_DIR`, and `llm build
--tune`): attention backend, threads, KV block size and token budget (max_num_batched_tokens),
timed through the engine on this machine and recorded in the engine's manifest, which
`LLM(ENGINE_DIR)` and `llm serve` read (loader/engine_manifest.py's `tuned_options`).

Unlike the dtype (autodeploy/tune.py) these are options of `LLM`, not of the saved model, so each
trial loads the engine with `LLM(ENGINE_DIR, **options)` and runs one workload through the whole
engine (scheduler, block manager, the backend's kernels): the first PROMPT_TOKENS of each
calibration window as prompts, admitted together, each then decoding DECODE_TOKENS greedy tokens,
prefix caching off (the second timing would be a cache hit), best of two timings. The options are
tuned one at a time in the order above, each with the others at their best so far (coordinate
descent): the sum of the candidate lists in engine loads, not their product. A candidate replaces
the current value only when it is MARGIN faster (a shared machine's noise is not a choice) and its
perplexity on the windows' prompt tokens is within the accuracy budget of the engine's defaults.
For the token budget the smallest within MARGIN of the fastest is kept: a smaller budget bounds
how long a prefill chunk holds up the running decodes, at no throughput cost when a larger one is
no faster. Trials stop at the time limit: the candidates not reached are left out (the report
names them). A module of its own, not of autodeploy/: it runs the engine, which loads built
engines through autodeploy/.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llm_engine.autodeploy.sensitivity import calibration_files, calibration_tokens
from llm_engine.config import EngineConfig
from llm_engine.layers.native import KernelBuildError, load_kernels
from llm_engine.llm import LLM
from llm_engine.loader import ModelSource
from llm_engine.loader.engine_manifest import write_manifest
from llm_engine.outputs import RequestOutput
from llm_engine.sampling_params import SamplingParams

PROMPT_TOKENS = 128  # of each calibration window: the trial's prompts, prefilled together
DECODE_TOKENS = 16  # greedy tokens each window's sequence decodes after its prompt
_TOKEN_BUDGETS = [2048, 256, 128]  # the default, then below the trial's prompt tokens (4 x 128): they split its prefill
MARGIN = 0.03  # a candidate must be this much faster (relative tokens/s) to replace the current value
TIME_LIMIT = 300.0  # seconds of trials by default
BUDGET = 0.01  # perplexity within 1% of the engine's defaults unless given another budget
_WINDOWS = 4  # calibration windows: the trial's sequences
_PERPLEXITY_WINDOWS = 2
_TIMINGS = 2
_DEFAULTS = {name: EngineConfig.__dataclass_fields__[name].default
             for name in ("attention_backend", "num_threads", "block_size", "max_num_batched_tokens")}


@dataclass
class RuntimeTrial:
    options: dict[str, Any]
    tokens_per_s: float  # prompt and generated tokens of the workload per second
    perplexity: float  # of the first windows' prompt tokens

    def line(self) -> str:
        shown = ", ".join(f"{name} {value}" for name, value in self.options.items())
        return f"runtime {shown}: {self.tokens_per_s:.1f} tok/s, perplexity {self.perplexity:.3f}"


@dataclass
class RuntimeChoice:
    options: dict[str, Any]  # what LLM(ENGINE_DIR) uses unless the caller says otherwise
    trials: list[RuntimeTrial] = field(default_factory=list)
    untried: list[str] = field(default_factory=list)  # "option value" candidates the time limit left out

    def manifest(self) -> dict[str, Any]:
        """The manifest's "runtime" entry; `cpus`: threads are this machine's choice only."""
        return {"options": self.options, "cpus": os.cpu_count(), "trials": [vars(t) for t in self.trials],
                "untried": self.untried}

    def lines(self) -> list[str]:
        chosen = ", ".join(f"{name} {value}" for name, value in self.options.items())
        return [*(t.line() for t in self.trials), f"runtime {chosen} (the fastest within the budget)",
                *([f"runtime: time limit reached, not tried: {', '.join(self.untried)}"] if self.untried else [])]


def _native_attention() -> bool:
    try:
        load_kernels()
    except KernelBuildError:
        return False
    return True


def candidates(device: torch.device) -> dict[str, list[Any]]:
    """Each option's values to try, the engine's default (resolved on this machine) first."""
    if device.type != "cpu":
        return {"attention_backend": ["triton", "torch"], "num_threads": [torch.get_num_threads()],
                "block_size": [16, 32], "max_num_batched_tokens": _TOKEN_BUDGETS}
    threads = torch.get_num_threads()
    return {"attention_backend": ["native", "torch"] if _native_attention() else ["torch"],
            "num_threads": list(dict.fromkeys([threads, os.cpu_count() or threads, max(1, threads // 2)])),
            "block_size": [16, 32], "max_num_batched_tokens": _TOKEN_BUDGETS}


def run_trial(folder: Path, options: dict[str, Any], windows: list[list[int]], device: torch.device) -> RuntimeTrial:
    """Load the engine with `options`, score the windows' perplexity, time the workload twice."""
    threads = torch.get_num_threads()
    block_size = options["block_size"]
    blocks = len(windows) * -(-(PROMPT_TOKENS + DECODE_TOKENS) // block_size)
    llm = LLM(str(folder), device=str(device), num_kv_blocks=blocks, enable_prefix_caching=False, **options)
    try:
        windows = [w[:min(PROMPT_TOKENS, llm.engine.max_model_len - DECODE_TOKENS)] for w in windows]
        scored = _generated(llm, windows[:_PERPLEXITY_WINDOWS], SamplingParams(max_tokens=1, prompt_logprobs=0))
        logprobs = [entry[token].logprob for out in scored
                    for entry, token in zip(out.prompt_logprobs or [], out.prompt_token_ids) if entry is not None]
        greedy = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)
        tokens = sum(len(w) for w in windows) + len(windows) * DECODE_TOKENS
        best = 0.0
        for _ in range(_TIMINGS):
            start = time.perf_counter()
            _generated(llm, windows, greedy)
            best = max(best, tokens / (time.perf_counter() - start))
    finally:
        llm.engine.shutdown()
        del llm
        gc.collect()
        torch.set_num_threads(threads)  # a trial's num_threads is process-wide; the next starts as this one did
    return RuntimeTrial(dict(options), best, math.exp(-sum(logprobs) / len(logprobs)))


def _generated(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
    """The outputs, or the first request's error: a trial whose requests failed has no speed."""
    outputs = llm.generate(prompts, params, use_tqdm=False)
    failed = next((o.error for o in outputs if o.error), None)
    if failed:
        raise RuntimeError(f"--tune: a trial's request failed: {failed}")
    return outputs


def _pick(option: str, tried: list[RuntimeTrial], current: RuntimeTrial, limit: float) -> RuntimeTrial:
    """The trial `option` keeps: the token budget's smallest within MARGIN of the fastest, any
    other option's fastest if MARGIN faster than the current value; only within the perplexity limit."""
    allowed = [t for t in tried if t.perplexity <= limit]
    if option == "max_num_batched_tokens":
        fastest = max([current, *allowed], key=lambda t: t.tokens_per_s)
        near = [t for t in [current, *allowed] if t.tokens_per_s >= fastest.tokens_per_s * (1 - MARGIN)]
        return min(near, key=lambda t: t.options[option])
    best = max(allowed, key=lambda t: t.tokens_per_s, default=current)
    return best if best.tokens_per_s > current.tokens_per_s * (1 + MARGIN) else current


def tune_engine(folder: Path, budget: float = BUDGET, calibration: list[Path] | None = None,
                progress: Callable[[str], None] = print, time_limit: float = TIME_LIMIT) -> RuntimeChoice:
    """Measure the built engine in `folder` on this machine, choose its runtime options (see the
    module's doc) and record them in its manifest."""
    start = time.perf_counter()
    source = ModelSource(str(folder))
    if source.engine is None:
        raise ValueError(f"ENGINE_DIR: {folder} is not a built engine (`codeyard llm build SRC --out ENGINE_DIR`)")
    hf_config = source.hf_config()
    windows = calibration_tokens(calibration_files(calibration), source.tokenizer(), hf_config.get_text_config().vocab_size, _WINDOWS,
                                 PROMPT_TOKENS)
    device = torch.device(source.engine.target)
    progress(f"timing runtime options through LLM({str(folder)!r}) (up to {time_limit:.0f} s)")
    grid = candidates(device)
    current = run_trial(folder, {name: values[0] for name, values in grid.items()}, windows, device)
    progress(f"      {current.line()} (the engine's defaults)")
    choice = RuntimeChoice(current.options, [current])
    limit = current.perplexity * (1 + budget)
    for option, values in grid.items():
        tried = []
        for value in values[1:]:
            if time.perf_counter() - start > time_limit:
                choice.untried.append(f"{option} {value}")
                continue
            tried.append(run_trial(folder, {**current.options, option: value}, windows, device))
            progress(f"      {tried[-1].line()}")
        choice.trials.extend(tried)
        current = _pick(option, tried, current, limit)
    choice.options = current.options
    write_manifest(folder, {**{k: v for k, v in source.engine.data.items() if k not in ("format", "versions")},
                            "runtime": choice.manifest()})
    return choice


def engine_defaults() -> dict[str, Any]:
    """The engine's own values of the tuned options (EngineConfig's defaults): what a caller
    passes to run a tuned engine as an untuned one."""
    return dict(_DEFAULTS)
