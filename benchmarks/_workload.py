"""Seeded workloads and the metric math shared by the LLM benchmarks.

Kept apart from the runners so the numbers (percentiles, KV waste) can be unit
tested on tiny inputs without loading any model.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: prompt token ids and the exact output length."""

    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class RequestTiming:
    """What one system measured for one request, in seconds on one clock.

    `start` is when the system began serving the request (see the README for
    what that means per system), `first_token` when the first output token was
    available, `finished` when the last one was.
    """

    start: float
    first_token: float
    finished: float
    num_tokens: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None for 1-token outputs."""
        if self.num_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.num_tokens - 1)


def random_workload(
    num_requests: int,
    vocab_low: int,
    vocab_high: int,
    input_len: tuple[int, int] = (16, 512),
    output_len: tuple[int, int] = (16, 256),
    seed: int = 0,
) -> list[BenchRequest]:
    """Prompts of uniformly random length made of random ordinary token ids.

    Token ids are drawn from [vocab_low, vocab_high) so that special tokens
    (BOS/EOS/chat markers, at the bottom of SmolLM2's vocabulary) never appear.
    """
    if num_requests < 1:
        raise ValueError("num_requests must be at least 1")
    if not 0 <= vocab_low < vocab_high:
        raise ValueError("vocab_low must be >= 0 and below vocab_high")
    for name, (low, high) in (("input_len", input_len), ("output_len", output_len)):
        if not 1 <= low <= high:
            raise ValueError(f"{name} must be a (low, high) pair with 1 <= low <= high")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        n_in = rng.randint(*input_len)
        n_out = rng.randint(*output_len)
        prompt = [rng.randrange(vocab_low, vocab_high) for _ in range(n_in)]
        requests.append(BenchRequest(prompt, n_out))
    return requests


def shared_prefix_workload(
    num_requests: int,
    vocab_low: int,
    vocab_high: int,
    prefix_len: int = 512,
    suffix_len: tuple[int, int] = (16, 64),
    output_len: int = 16,
    seed: int = 0,
) -> list[BenchRequest]:
    """Requests that share one `prefix_len`-token preamble and differ after it."""
    if prefix_len < 1:
        raise ValueError("prefix_len must be at least 1")
    rng = random.Random(seed + 1)
    preamble = [rng.randrange(vocab_low, vocab_high) for _ in range(prefix_len)]
    tails = random_workload(
        num_requests, vocab_low, vocab_high, suffix_len, (output_len, output_len), seed + 2
    )
    return [BenchRequest(preamble + t.prompt_token_ids, t.max_tokens) for t in tails]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between ranks, like numpy's default."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError("q must be between 0 and 100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class RunSummary:
    """The figures printed for one system on one workload."""

    system: str
    num_requests: int
    output_tokens: int
    elapsed_s: float
    output_tok_per_s: float
    req_per_s: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float


def summarize(system: str, timings: list[RequestTiming], elapsed_s: float) -> RunSummary:
    """Throughput over the whole run's wall time plus TTFT/TPOT percentiles over requests."""
    if elapsed_s <= 0:
        raise ValueError("elapsed_s must be positive")
    ttfts = [t.ttft for t in timings]
    tpots = [t.tpot for t in timings if t.tpot is not None]
    out_tokens = sum(t.num_tokens for t in timings)
    return RunSummary(
        system=system,
        num_requests=len(timings),
        output_tokens=out_tokens,
        elapsed_s=elapsed_s,
        output_tok_per_s=out_tokens / elapsed_s,
        req_per_s=len(timings) / elapsed_s,
        ttft_mean_s=sum(ttfts) / len(ttfts),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile(tpots, 50) if tpots else math.nan,
        tpot_p99_s=percentile(tpots, 99) if tpots else math.nan,
    )


@dataclass
class KvWasteMeter:
    """Accumulates KV-cache occupancy snapshots taken during a run.

    Each snapshot gives the slots the paged cache has allocated, how many of
    them hold a computed token (a block shared by several sequences counts
    once), and each running sequence's length. Waste is summed over snapshots
    (slot-steps), so a long-lived half-empty block counts for as long as it
    exists. The contiguous figure is what the same sequences would waste if
    each had `max_len` slots reserved up front, as a max-length preallocated
    cache does.
    """

    max_len: int
    allocated_slots: int = 0
    held_slots: int = 0
    contiguous_slots: int = 0
    contiguous_held: int = 0
    snapshots: int = 0
    peak_paged_waste: float = 0.0

    def record(self, allocated_slots: int, held_slots: int, seq_lengths: list[int]) -> None:
        if held_slots > allocated_slots:
            raise ValueError("held_slots cannot exceed allocated_slots")
        if any(n > self.max_len for n in seq_lengths):
            raise ValueError("a sequence is longer than max_len")
        if allocated_slots == 0:
            return
        self.allocated_slots += allocated_slots
        self.held_slots += held_slots
        self.contiguous_slots += self.max_len * len(seq_lengths)
        self.contiguous_held += sum(seq_lengths)
        self.snapshots += 1
        self.peak_paged_waste = max(self.peak_paged_waste, 1 - held_slots / allocated_slots)

    @property
    def paged_waste(self) -> float:
        return 1 - self.held_slots / self.allocated_slots if self.allocated_slots else 0.0

    @property
    def contiguous_waste(self) -> float:
        return 1 - self.contiguous_held / self.contiguous_slots if self.contiguous_slots else 0.0
