"""Plots of result files: latency-throughput curves per target, and figures over commits.

`write(paths, out)` draws PNGs with matplotlib (next to `out`) and a self-contained HTML page that
embeds them (base64) with a table of every result, so the report can be mailed or attached to CI.
"""

from __future__ import annotations

import base64
import html
import io
import statistics
from pathlib import Path

from benchmarks.framework import results


def _median(runs: list[dict], figure: str) -> float:
    return statistics.median(r[figure] for r in runs)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def curve(result: dict) -> bytes:
    """TTFT p50 and p99 against output tokens/s, one line per target through its phases."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    targets: dict[str, list[tuple[float, float, float]]] = {}
    for key, entry in result["figures"].items():
        target = key.split(" / ", 1)[0]
        runs = entry["runs"]
        targets.setdefault(target, []).append((_median(runs, "output_tokens_per_s"), _median(runs, "ttft_p50_ms"),
                                               _median(runs, "ttft_p99_ms")))
    for target, points in targets.items():
        points.sort()
        for ax, index in ((axes[0], 1), (axes[1], 2)):
            ax.plot([p[0] for p in points], [p[index] for p in points], marker="o", label=target)
    for ax, title in ((axes[0], "TTFT p50"), (axes[1], "TTFT p99")):
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("ms")
        ax.set_title(f"{result['name']}: {title} vs throughput")
        ax.grid(alpha=0.3)
        ax.legend()
    data = _png(fig)
    plt.close(fig)
    return data


def history(items: list[dict], figure: str) -> bytes:
    """Median of `figure` per result, in the order they were made, labelled by commit."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.4))
    keys = sorted({k for r in items for k in r["figures"]})
    for key in keys:
        xs, ys = [], []
        for i, r in enumerate(items):
            runs = r["figures"].get(key, {}).get("runs", [])
            values = [run[figure] for run in runs if figure in run]
            if values:
                xs.append(i)
                ys.append(statistics.median(values))
        if ys:
            ax.plot(xs, ys, marker="o", label=key)
    ax.set_xticks(range(len(items)), [r["git"]["commit"][:7] for r in items], rotation=30)
    ax.set_ylabel(figure)
    ax.set_title(f"{figure} over commits")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    data = _png(fig)
    plt.close(fig)
    return data


def _suite_figures(result: dict, runs: list[dict]) -> str:
    """A self-timed suite's own figures (medians), which the fixed columns do not name."""
    if result["kind"] != "suite":
        return ""
    return ", ".join(f"{f} {_median(runs, f):.4g}" for f in result.get("directions", {})
                     if all(isinstance(run.get(f), (int, float)) for run in runs))


def write(paths: list[str], out: str) -> list[Path]:
    """Write the PNGs and the HTML page; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    items = sorted((results.load(p) for p in paths), key=lambda r: r["created"])
    out_path = Path(out)
    images: list[tuple[str, bytes]] = []
    for r in items:
        if r["kind"] == "workload":
            images.append((f"{r['name']} at {r['git']['commit'][:7]}", curve(r)))
    if len(items) > 1:
        figure = {"gate": "throughput_ratio", "suite": next(iter(items[-1].get("directions", {})), "")}.get(
            items[-1]["kind"], "output_tokens_per_s")
        images.append((f"{figure} over commits", history(items, figure)))
    pngs = []
    for i, (_, data) in enumerate(images):
        png = out_path.with_name(f"{out_path.stem}-{i + 1}.png")
        png.write_bytes(data)
        pngs.append(png)
    rows = "".join(
        f"<tr><td>{html.escape(r['created'])}</td><td><code>{r['git']['commit'][:10]}</code>"
        f"{' +dirty' if r['git']['dirty'] else ''}</td><td>{html.escape(r['kind'])}: {html.escape(r['name'])}</td>"
        f"<td>{html.escape(key)}</td><td>{len(entry['runs'])}</td>"
        + "".join(f"<td>{_median(entry['runs'], f):.2f}</td>" if f in entry["runs"][0] else "<td></td>"
                  for f in ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "throughput_ratio"))
        + f"<td>{html.escape(_suite_figures(r, entry['runs']))}</td><td>{html.escape(r['machine']['id'])}</td></tr>"
        for r in items for key, entry in r["figures"].items())
    figures = "".join(f"<figure><img alt=\"{html.escape(title)}\" src=\"data:image/png;base64,"
                      f"{base64.b64encode(data).decode()}\"><figcaption>{html.escape(title)}</figcaption></figure>"
                      for title, data in images)
    out_path.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Codeyard benchmark report</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:nth-child(-n+4){{text-align:left}}
img{{max-width:100%}}figure{{margin:1em 0}}</style></head><body>
<h1>Codeyard benchmark report</h1>
<p>{len(items)} result file(s); medians over repeats.</p>
{figures}
<table><thead><tr><th>created</th><th>commit</th><th>run</th><th>target / phase</th><th>repeats</th>
<th>tok/s</th><th>TTFT p50 ms</th><th>TPOT p50 ms</th><th>ratio</th><th>suite figures</th><th>machine</th></tr></thead>
<tbody>{rows}</tbody></table></body></html>
""")
    return pngs
