"""The systems our engine is compared with: Transformers (one at a time and in
padded batches) and llama.cpp (one at a time), each timed per request.

Every runner takes a workload and returns one RequestTiming per request plus
the wall time of the whole run, all on time.perf_counter().
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks._workload import BenchRequest, RequestTiming

Progress = Callable[[int, int], None]


class StepClock:
    """A Transformers streamer that only records when each decoding step's tokens arrive.

    `generate` calls `put` once with the prompt and then once per step, for any
    batch size; the time of the k-th step is when every row has its k-th token.
    """

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.step_times.append(time.perf_counter())

    def end(self) -> None:
        pass


def load_hf_model(folder: Path, gguf_file: str, dtype: torch.dtype) -> torch.nn.Module:
    """Transformers' own GGUF loader: the Q4_1 weights are dequantized to `dtype`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=dtype)
    return model.eval()


def _hf_generate(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int
) -> tuple[torch.Tensor, list[float]]:
    """Greedy generation of exactly `new_tokens` per row (EOS cannot stop it early)."""
    clock = StepClock()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=clock,
        )
    generated = out.shape[1] - input_ids.shape[1]
    if generated != new_tokens or len(clock.step_times) != new_tokens:
        raise RuntimeError(f"Transformers produced {generated} tokens, asked for {new_tokens}")
    return out, clock.step_times


def run_hf_single(
    model: torch.nn.Module, workload: list[BenchRequest], progress: Progress, device: torch.device | None = None
) -> tuple[list[RequestTiming], float]:
    """One request at a time; each request's clock starts when its turn comes. `device`: where the
    model is (the CPU by default)."""
    timings = []
    run_start = time.perf_counter()
    for i, req in enumerate(workload):
        ids = torch.tensor([req.prompt_token_ids], device=device)
        start = time.perf_counter()
        _, steps = _hf_generate(model, ids, torch.ones_like(ids), req.max_tokens)
        timings.append(RequestTiming(start, steps[0], steps[-1], req.max_tokens))
        progress(i + 1, len(workload))
    return timings, time.perf_counter() - run_start


def run_hf_batched(
    model: torch.nn.Module, workload: list[BenchRequest], batch_size: int, progress: Progress,
    device: torch.device | None = None,
) -> tuple[list[RequestTiming], float]:
    """Static batches in workload order, left-padded, run to the batch's longest output.

    A request's first token is the batch's first step and it is finished at
    the step that produced its own last token (the batch keeps going for the
    others, which is the waste continuous batching removes).
    """
    timings = []
    run_start = time.perf_counter()
    for first in range(0, len(workload), batch_size):
        batch = workload[first : first + batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, req in enumerate(batch):
            n = len(req.prompt_token_ids)
            ids[row, width - n :] = torch.tensor(req.prompt_token_ids)
            mask[row, width - n :] = 1
        ids, mask = ids.to(device), mask.to(device)
        start = time.perf_counter()
        _, steps = _hf_generate(model, ids, mask, max(r.max_tokens for r in batch))
        timings += [RequestTiming(start, steps[0], steps[r.max_tokens - 1], r.max_tokens) for r in batch]
        progress(first + len(batch), len(workload))
    return timings, time.perf_counter() - run_start


def llamacpp_model_params() -> Any:
    """llama.cpp's default model parameters with its CPU "extra buffer types" off, as
    `llama-batched-bench --no-repack` runs: on a CPU with AMX the native build repacks the weights
    for its AMX matmul, which faults on the first decode (SIGILL before the process holds the tile
    state, SIGSEGV after: upstream llama.cpp#20824; #16315 reports wrong results there too)."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    return params


def llamacpp_llama(**kwargs: Any) -> Any:
    """llama_cpp.Llama(**kwargs) loaded with `llamacpp_model_params`: the class builds its model
    parameters itself and has no option for them, so its default is swapped while it loads."""
    import llama_cpp
    import llama_cpp.llama_cpp as bindings

    default = bindings.llama_model_default_params
    bindings.llama_model_default_params = llamacpp_model_params
    try:
        return llama_cpp.Llama(**kwargs)
    finally:
        bindings.llama_model_default_params = default


def run_llamacpp(
    gguf_path: Path, workload: list[BenchRequest], threads: int, progress: Progress
) -> tuple[list[RequestTiming], float]:
    """llama.cpp's own Q4_1 kernels, one request at a time, greedy, token by token.

    The low-level eval/sample loop never checks for EOS, so every request
    produces exactly its `max_tokens`.
    """
    n_ctx = max(len(r.prompt_token_ids) + r.max_tokens for r in workload)
    llm = llamacpp_llama(
        model_path=str(gguf_path),
        n_ctx=n_ctx,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    timings = []
    run_start = time.perf_counter()
    for i, req in enumerate(workload):
        start = time.perf_counter()
        llm.reset()
        llm.eval(req.prompt_token_ids)
        first_token = 0.0
        for k in range(req.max_tokens):
            token = llm.sample(temp=0.0)
            if k == 0:
                first_token = time.perf_counter()
            if k + 1 < req.max_tokens:
                llm.eval([token])
        timings.append(RequestTiming(start, first_token, time.perf_counter(), req.max_tokens))
        progress(i + 1, len(workload))
    return timings, time.perf_counter() - run_start
