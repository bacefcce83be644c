"""Run a workload against targets: warm-up, then every phase `repeats` times per target, all in one
process and one run, so the targets' figures are comparable (the protocol-overhead table)."""

from __future__ import annotations

import asyncio
import time

from benchmarks.framework import results
from benchmarks.framework.targets import Server, make_target
from benchmarks.framework.workloads import Phase, Workload

# Once a second: a server target's probe is a GET /metrics that the server renders whole, work the
# offline target never pays, so probing 4 times a second added to the protocol overhead it measures.
PROBE_INTERVAL_S = 1.0


async def run_phase(target, phase: Phase) -> tuple[list, float, int, float]:
    """Send the phase's items at their arrival times; (samples, seconds, peak RSS, peak KV usage)."""
    peak_rss, peak_kv = 0, 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal peak_rss, peak_kv
        while not done.is_set():
            rss, kv = await asyncio.to_thread(target.probe)
            peak_rss, peak_kv = max(peak_rss, rss), max(peak_kv, kv)
            await asyncio.sleep(PROBE_INTERVAL_S)

    prober = asyncio.ensure_future(probe())
    start = time.perf_counter()

    async def at(item):
        await asyncio.sleep(max(0.0, start + item.at - time.perf_counter()))
        return await target.send(item)

    samples = await asyncio.gather(*(at(item) for item in phase.items))
    duration = time.perf_counter() - start
    done.set()
    await prober
    return samples, duration, peak_rss, peak_kv


async def run(workload: Workload, target_kinds: list[str], repeats: int, server: Server | None,
              offline_args: dict, ttft_slo_ms: float, tpot_slo_ms: float, log=print) -> dict:
    result = results.new_result("workload", workload.name, {
        **workload.settings, "targets": target_kinds, "repeats": repeats, "ttft_slo_ms": ttft_slo_ms,
        "tpot_slo_ms": tpot_slo_ms, "model": offline_args.get("model"),
        "max_num_seqs": offline_args.get("max_num_seqs")})
    targets = [make_target(kind, server, offline_args) for kind in target_kinds]
    try:
        for target in targets:
            await run_phase(target, Phase("warm-up", workload.phases[0].items[:2]))
        for repeat in range(repeats):  # targets take turns, so a slow spell of the machine hits all
            for target in targets:
                for phase in workload.phases:
                    samples, duration, rss, kv = await run_phase(target, phase)
                    figures = results.summarize(samples, duration, ttft_slo_ms, tpot_slo_ms)
                    figures.update(peak_rss_mib=round(rss / 2**20, 1), peak_kv_usage=round(kv, 3))
                    results.add_repeat(result, f"{target.name} / {phase.label}", figures, phase.x)
                    errors = {s.error for s in samples if not s.ok}
                    log(f"{target.name:>7} {phase.label:>16} #{repeat + 1}: {figures['output_tokens_per_s']:8.1f} "
                        f"tok/s  TTFT p50 {figures['ttft_p50_ms']:7.1f} ms  TPOT p50 {figures['tpot_p50_ms']:6.1f} ms"
                        + (f"  failed {figures['failed']}: {sorted(errors)[:2]}" if errors else ""))
    finally:
        for target in targets:
            await target.aclose()
    return result
