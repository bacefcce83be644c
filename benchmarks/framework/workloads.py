"""Named, seeded workloads: what to send, how long each answer is, and when each request arrives.

Prompts are text cut from this repository's own Python sources (a fixed, local, code-like corpus)
to a token length, so the same workload goes through every target: offline, /v1, /v2, gRPC.
Every request is greedy with EOS ignored, so it produces exactly `max_tokens` tokens everywhere.
A workload is a list of phases (a grid cell, a request rate); results are summarised per phase,
which is what a latency-throughput curve plots.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS_GLOBS = ("llm_engine/**/*.py", "ide_server/**/*.py")


@dataclass(frozen=True)
class Item:
    prompt: str
    max_tokens: int
    at: float = 0.0  # seconds after its wave starts
    wave: int = 0  # a phase's waves run one after another, each when the previous one's requests are done


@dataclass
class Phase:
    label: str
    items: list[Item]
    x: float | None = None  # the phase's position on a curve (request rate, batch size)

    def waves(self) -> list[list[Item]]:
        """The items of each wave, in wave order and, within a wave, in the order they are sent."""
        numbers = sorted({item.wave for item in self.items})
        return [[item for item in self.items if item.wave == n] for n in numbers]


@dataclass
class Workload:
    name: str
    phases: list[Phase]
    settings: dict = field(default_factory=dict)


class Corpus:
    """Token ids of the local sources, cut into prompts of exact token lengths."""

    def __init__(self, tokenizer, max_chars: int = 400_000) -> None:
        self.tokenizer = tokenizer
        self.files = sorted(p for g in CORPUS_GLOBS for p in REPO.glob(g) if p.stat().st_size > 2000)
        text = "\n".join(p.read_text(errors="replace") for p in self.files)[:max_chars]
        self.ids = tokenizer(text, add_special_tokens=False).input_ids

    def text(self, rng: random.Random, num_tokens: int) -> str:
        start = rng.randrange(0, len(self.ids) - num_tokens)
        return self.tokenizer.decode(self.ids[start:start + num_tokens])

    def file_prefix(self, rng: random.Random, max_tokens: int) -> str:
        """A source file up to a random line (the cursor), at most `max_tokens` tokens before it."""
        lines = rng.choice(self.files).read_text(errors="replace").splitlines(keepends=True)
        cursor = rng.randrange(1, len(lines))
        ids = self.tokenizer("".join(lines[:cursor]), add_special_tokens=False).input_ids[-max_tokens:]
        return self.tokenizer.decode(ids)


def _tuple(value) -> tuple:
    """A grid axis given as one value or several."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _lengths(rng: random.Random, mean: int, low: int, high: int) -> int:
    """A log-normal length (sigma 0.6, as chat and code traces are skewed) clipped to [low, high]."""
    return max(low, min(high, int(rng.lognormvariate(math.log(mean), 0.6))))


def _arrivals(rng: random.Random, n: int, rate: float, burstiness: float = 1.0) -> list[float]:
    """Gamma inter-arrival gaps of mean 1/rate; burstiness 1 is Poisson, above 1 comes in bursts
    (vLLM's --burstiness is its inverse, the gamma shape). rate inf: all at once."""
    if rate == math.inf:
        return [0.0] * n
    shape = 1 / burstiness
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.gammavariate(shape, 1 / (rate * shape))
    return times


def grid(corpus: Corpus, seed: int, batch: tuple[int, ...] = (1, 4, 16), input_len: tuple[int, ...] = (32, 256),
         output_len: tuple[int, ...] = (32,)) -> Workload:
    """Synthetic: each batch x input x output cell is a burst of `batch` identical-length requests."""
    rng = random.Random(seed)
    batch, input_len, output_len = _tuple(batch), _tuple(input_len), _tuple(output_len)
    phases = [Phase(f"b{b} in{i} out{o}", [Item(corpus.text(rng, i), o) for _ in range(b)], x=b)
              for i in input_len for o in output_len for b in batch]
    return Workload("grid", phases, {"batch": batch, "input_len": input_len, "output_len": output_len})


def _rebursts(items: list[Item], bursts: int, rng: random.Random) -> list[Item]:
    """`bursts` waves of the same requests, each sent when the previous one's are done: the first in
    the given order, the others each in its own shuffled order (the same for every target, as the
    workload is built once), so which request reaches a server first varies between waves, not
    between targets."""
    if bursts < 1:
        raise ValueError(f"bursts must be at least 1, got {bursts}")
    waves = [list(items)]
    for _ in range(bursts - 1):
        waves.append(rng.sample(items, len(items)))
    return [dataclasses.replace(item, wave=n) for n, wave in enumerate(waves) for item in wave]


def poisson(corpus: Corpus, seed: int, rates: tuple[float, ...] = (1.0, 2.0, 4.0), num_requests: int = 16,
            input_mean: int = 128, output_mean: int = 32, burstiness: float = 1.0, bursts: int = 1,
            name: str = "poisson") -> Workload:
    """Realistic arrivals at each rate (then all at once), log-normal prompt and answer lengths.

    The burst phase is `bursts` bursts of the `num_requests` requests, each after the previous one's
    requests are done, its figures over all of them. One burst's requests share their first step
    (their prompts are in the prefix cache after the warm-up), so its TTFT p50 is one step's timing,
    ~10% apart between repeats on a shared host; several bursts make the phase's p50 a median of them."""
    phases = []
    rates = _tuple(rates)
    for rate in (*rates, math.inf):
        rng = random.Random(seed)  # the same requests at every rate, only their timing differs
        times = _arrivals(random.Random(seed + 1), num_requests, rate, burstiness)
        items = [Item(corpus.text(rng, _lengths(rng, input_mean, 8, 4 * input_mean)),
                      _lengths(rng, output_mean, 4, 4 * output_mean), at) for at in times]
        if rate == math.inf:
            items = _rebursts(items, bursts, random.Random(seed + 2))
        phases.append(Phase("burst" if rate == math.inf else f"{rate:g}/s", items, x=rate))
    return Workload(name, phases, {"rates": rates, "num_requests": num_requests, "input_mean": input_mean,
                                   "output_mean": output_mean, "burstiness": burstiness, "bursts": bursts})


def bursty(corpus: Corpus, seed: int, **kwargs) -> Workload:
    """Like poisson, but arrivals come in bursts (gamma gaps, coefficient of variation 2)."""
    return poisson(corpus, seed, burstiness=kwargs.pop("burstiness", 4.0), name="bursty", **kwargs)


def shared_prefix(corpus: Corpus, seed: int, num_requests: int = 16, prefix_len: int = 384,
                  suffix_len: int = 32, output_len: int = 16, rate: float = 4.0) -> Workload:
    """One long preamble (a system prompt, a big file) shared by every request; the prefix cache's case."""
    rng = random.Random(seed)
    preamble = corpus.text(rng, prefix_len)
    times = _arrivals(rng, num_requests, rate)
    items = [Item(preamble + corpus.text(rng, suffix_len), output_len, at) for at in times]
    return Workload("shared-prefix", [Phase(f"{rate:g}/s", items, x=rate)],
                    {"num_requests": num_requests, "prefix_len": prefix_len, "rate": rate})


def code_completion(corpus: Corpus, seed: int, num_requests: int = 24, context_tokens: int = 512,
                    output_len: int = 24, rate: float = 3.0) -> Workload:
    """Ghost-text requests as the assistant sends them: a local source file up to a cursor, short answers."""
    rng = random.Random(seed)
    times = _arrivals(rng, num_requests, rate)
    items = [Item(corpus.file_prefix(rng, context_tokens), output_len, at) for at in times]
    return Workload("code-completion", [Phase(f"{rate:g}/s", items, x=rate)],
                    {"num_requests": num_requests, "context_tokens": context_tokens, "rate": rate})


def chat(corpus: Corpus, seed: int, conversations: int = 6, turns: int = 4, user_len: int = 48,
         reply_len: int = 48, think_s: float = 1.0) -> Workload:
    """Multi-turn chat: each turn resends the conversation so far (a growing shared prefix) plus a
    new message, `think_s` after the previous turn could have been answered."""
    rng = random.Random(seed)
    items = []
    for _conversation in range(conversations):
        history, at = "", rng.uniform(0, conversations / 2)
        for _ in range(turns):
            history += corpus.text(rng, user_len)
            items.append(Item(history, reply_len, at))
            history += corpus.text(rng, reply_len)
            at += think_s + rng.expovariate(1 / think_s)
    items.sort(key=lambda item: item.at)
    return Workload("chat", [Phase(f"{conversations}x{turns}", items, x=conversations)],
                    {"conversations": conversations, "turns": turns, "think_s": think_s})


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "grid": grid, "poisson": poisson, "bursty": bursty, "shared-prefix": shared_prefix,
    "code-completion": code_completion, "chat": chat,
}
