"""Run a workload against targets: warm-up, then every phase `repeats` times per target, all in one
process and one run, so the targets' figures are comparable (the protocol-overhead table).

Each engine's warm-up is the whole workload, every request once, sent together and untimed, through
the first target that reaches it. With a shorter one the first target to run a phase on the server
met a cold prefix cache and the others reused its blocks (/v1 had 2.6 s TTFT in repeat 1 where /v2,
right after it, had 0.4 s), so the order of the targets leaked into the comparison. Warmed this
way, every timed run of every target finds the same cache: the prompts' blocks are in (the offline
engine's own cache is warmed alike). The other targets of a warm engine (/v2 and gRPC after /v1)
send only a few requests, enough to open their connections and streams: the whole workload again
added two untimed bursts to a run that should fit a few quiet minutes.

The targets take turns in each repeat, and the turn order rotates from repeat to repeat (offline
first, then /v1 first, ...), so no target always runs right after the same neighbour or first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

from benchmarks._workload import percentile
from benchmarks.framework import results
from benchmarks.framework.targets import Server, make_target
from benchmarks.framework.workloads import Phase, Workload

# Once a second: a server target's probe is a GET /metrics that the server renders whole, work the
# offline target never pays, so probing 4 times a second added to the protocol overhead it measures.
# Even once a second it is a visible share of a server's CPU outside the engine (prometheus_client
# renders every histogram bucket), so the CPU-per-token comparison runs with --probe-interval 0.
PROBE_INTERVAL_S = 1.0
# A target whose engine another target warmed: enough requests to open its connections and streams.
PATH_WARMUP_REQUESTS = 2


@dataclasses.dataclass
class PhaseRun:
    samples: list
    duration: float
    peak_rss: int
    peak_kv: float
    cpu: tuple[float, float, float] | None  # serving process seconds: (engine CPU, whole CPU, engine's CPU wait)
    engine_ttft: tuple[float, int] | None  # the engine's own TTFT over the phase: (seconds summed, requests)
    connections_opened: int | None = None  # an HTTP target's new connections while the phase ran


def _sum(a: tuple | None, b: tuple | None) -> tuple | None:
    return None if a is None or b is None else tuple(x + y for x, y in zip(a, b, strict=True))


def _diff(after: tuple | None, before: tuple | None) -> tuple | None:
    return None if after is None or before is None else tuple(x - y for x, y in zip(after, before, strict=True))


async def run_phase(target, phase: Phase, probe_interval: float = PROBE_INTERVAL_S) -> PhaseRun:
    """Send the phase's items at their arrival times, sampling memory and KV usage every
    `probe_interval` seconds (0: never, so a server does no work for the benchmark), and CPU time.
    A phase of several waves (`Item.wave`, the burst phase's `bursts`) sends each when the previous
    one's requests are done; its duration, CPU and engine TTFT are the sums over its waves, each
    measured from the wave's start, so what runs between waves (the pool's warm-up) is not counted."""
    peak_rss, peak_kv = 0, 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal peak_rss, peak_kv
        while probe_interval and not done.is_set():
            rss, kv = await asyncio.to_thread(target.probe)
            peak_rss, peak_kv = max(peak_rss, rss), max(peak_kv, kv)
            await asyncio.sleep(probe_interval)

    prepare = getattr(target, "prepare", None)  # an HTTP target warms its connection pool
    opened = 0 if getattr(target, "connections_opened", None) is not None else None
    samples: list = []
    duration, cpu, engine_ttft = 0.0, (0.0, 0.0, 0.0), (0.0, 0)
    prober = asyncio.ensure_future(probe())
    for wave in phase.waves():
        if prepare is not None:  # before each wave: a wave's pool idles out while the last one's tail runs
            await prepare(Phase(phase.label, wave, phase.x))
        opened_before = getattr(target, "connections_opened", None)
        cpu_before, ttft_before = target.cpu(), await asyncio.to_thread(target.engine_ttft)
        start = time.perf_counter()

        async def at(item, start=start):
            await asyncio.sleep(max(0.0, start + item.at - time.perf_counter()))
            return await target.send(item)

        samples += await asyncio.gather(*(at(item) for item in wave))
        duration += time.perf_counter() - start
        cpu_after, ttft_after = target.cpu(), await asyncio.to_thread(target.engine_ttft)
        cpu = _sum(cpu, _diff(cpu_after, cpu_before))
        engine_ttft = _sum(engine_ttft, _diff(ttft_after, ttft_before))
        if opened is not None:
            opened += target.connections_opened - opened_before
    done.set()
    await prober
    return PhaseRun(samples, duration, peak_rss, peak_kv, cpu, engine_ttft, opened)


def phase_figures(run: PhaseRun, phase: Phase, ttft_slo_ms: float, tpot_slo_ms: float, probed: bool) -> dict:
    """One phase run's stored figures: the summary, the probes' peaks (when it probed), CPU, the TTFT
    split, connections, the waves' TTFT and each request (for pairing a request with itself)."""
    figures = results.summarize(run.samples, run.duration, ttft_slo_ms, tpot_slo_ms)
    if probed:
        figures.update(peak_rss_mib=round(run.peak_rss / 2**20, 1), peak_kv_usage=round(run.peak_kv, 3))
    figures.update(cpu_figures(run))
    figures.update(ttft_split(run))
    if run.connections_opened is not None:
        figures["connections_opened"] = run.connections_opened
    figures.update(wave_ttft(run, phase))
    figures["requests"] = results.per_request(run.samples)
    return figures


def cpu_figures(run: PhaseRun) -> dict:
    """CPU milliseconds per output token of the serving process: its engine threads, and the rest
    (a server's event loop and gRPC threads; offline, the in-process consumer of the outputs); and
    the milliseconds per token its engine threads waited for a CPU (the machine's load)."""
    tokens = sum(s.tokens for s in run.samples if s.ok)
    if run.cpu is None or not tokens:
        return {}
    engine, whole, wait = run.cpu
    # The engine's threads are read one by one, each rounded to a clock tick: on a short phase their
    # sum can pass the process's own total by a tick or two (seen in CI), so the rest is then 0.
    rest = max(0.0, whole - engine)
    return {"engine_cpu_ms_per_token": round(engine * 1000 / tokens, 3),
            "serving_cpu_ms_per_token": round(rest * 1000 / tokens, 3),
            "engine_wait_ms_per_token": round(wait * 1000 / tokens, 3)}


def ttft_split(run: PhaseRun) -> dict:
    """Mean TTFT as the client saw it, the engine's part of it (from `generate` to the first token,
    by the engine's clock) and the rest: what a protocol adds before and after the engine (parsing,
    tokenizing, the hand-offs to and from the engine's thread, the first frame). The engine's part
    carries the prefill and the queueing that vary with the machine's load, so the rest compares
    targets where TTFT itself is noise. Left out unless the engine counted every request of the phase."""
    ok = [s for s in run.samples if s.ok]
    if run.engine_ttft is None or not ok or run.engine_ttft[1] != len(ok):
        return {}
    client = sum(s.first - s.start for s in ok) * 1000 / len(ok)
    engine = run.engine_ttft[0] * 1000 / run.engine_ttft[1]
    return {"ttft_mean_ms": round(client, 2), "engine_ttft_mean_ms": round(engine, 2),
            "ttft_outside_engine_ms": round(client - engine, 2)}


def wave_ttft(run: PhaseRun, phase: Phase) -> dict:
    """Each wave's own TTFT p50 (ms), for a phase of several waves: how far its bursts' figures
    spread, which the phase's p50 over all of them evens out (a wave with a failed request: nan)."""
    waves = phase.waves()
    if len(waves) < 2:
        return {}
    p50s, at = [], 0
    for wave in waves:
        samples, at = run.samples[at:at + len(wave)], at + len(wave)
        ok = all(s.ok for s in samples)
        p50s.append(round(percentile([(s.first - s.start) * 1000 for s in samples], 50), 1) if ok else math.nan)
    return {"wave_ttft_p50_ms": p50s}


def turns(targets: list, repeats: int) -> list[list]:
    """Each repeat's order of the targets: every one in turn, the first moving one place per repeat."""
    return [targets[r % len(targets):] + targets[:r % len(targets)] for r in range(repeats)]


async def run(workload: Workload, target_kinds: list[str], repeats: int, server: Server | None,
              offline_args: dict, ttft_slo_ms: float, tpot_slo_ms: float, log=print,
              probe_interval: float = PROBE_INTERVAL_S) -> dict:
    result = results.new_result("workload", workload.name, {
        **workload.settings, "targets": target_kinds, "repeats": repeats, "ttft_slo_ms": ttft_slo_ms,
        "tpot_slo_ms": tpot_slo_ms, "model": offline_args.get("model"),
        "max_num_seqs": offline_args.get("max_num_seqs"), "probe_interval_s": probe_interval})
    result["warmup_requests"] = {}
    targets = [make_target(kind, server, offline_args) for kind in target_kinds]
    try:
        # each phase's first wave: its later waves (the burst phase's `bursts`) resend the same requests
        everything = [dataclasses.replace(item, at=0.0) for phase in workload.phases
                      for wave in phase.waves()[:1] for item in wave]
        warm_engines: list = []  # the offline target itself, or the Server behind /v1, /v2 and gRPC
        for target in targets:
            engine = getattr(target, "server", target)
            items = everything[:PATH_WARMUP_REQUESTS] if engine in warm_engines else everything
            warm_engines.append(engine)
            warm = await run_phase(target, Phase("warm-up", items))
            result["warmup_requests"][target.name] = sum(s.ok for s in warm.samples)
            log(f"{target.name:>7} {'warm-up':>16}: {len(warm.samples)} requests in {warm.duration:.1f} s")
        orders = turns(targets, repeats)
        result["turns"] = [[t.name for t in order] for order in orders]
        for repeat, order in enumerate(orders):  # a slow spell of the machine hits every target
            for target in order:
                for phase in workload.phases:
                    measured = await run_phase(target, phase, probe_interval)
                    figures = phase_figures(measured, phase, ttft_slo_ms, tpot_slo_ms, probed=bool(probe_interval))
                    results.add_repeat(result, f"{target.name} / {phase.label}", figures, phase.x)
                    errors = {s.error for s in measured.samples if not s.ok}
                    cpu = (f"  CPU ms/token engine {figures['engine_cpu_ms_per_token']:.2f} serving "
                           f"{figures['serving_cpu_ms_per_token']:.3f} engine waited "
                           f"{figures['engine_wait_ms_per_token']:.2f}" if "engine_cpu_ms_per_token" in figures else "")
                    outside = (f"  TTFT outside the engine {figures['ttft_outside_engine_ms']:.2f} ms"
                               if "ttft_outside_engine_ms" in figures else "")
                    log(f"{target.name:>7} {phase.label:>16} #{repeat + 1}: {figures['output_tokens_per_s']:8.1f} "
                        f"tok/s  TTFT p50 {figures['ttft_p50_ms']:7.1f} ms  TPOT p50 {figures['tpot_p50_ms']:6.1f} ms"
                        + cpu + outside + (f"  new connections {figures['connections_opened']}"
                                           if "connections_opened" in figures else "")
                        + (f"  failed {figures['failed']}: {sorted(errors)[:2]}" if errors else "")
                        + (f"  TTFT p50 by wave {figures['wave_ttft_p50_ms']}" if "wave_ttft_p50_ms" in figures else ""))
    finally:
        for target in targets:
            await target.aclose()
    return result
