"""`codeyard llm build SRC --out ENGINE_DIR` and `codeyard llm tune ENGINE_DIR` (registered on
llm_engine/cli.py's app). Outside autodeploy/: tuning runs the engine, which loads engines through it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def build(
    source: Annotated[str, typer.Argument(metavar="SRC", help="Local Hugging Face model folder or .gguf file.")],
    out: Annotated[Path, typer.Option(help="Engine folder to write (new, empty, or an engine to replace).")],
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16, or auto: build each dtype this machine may "
                                            "run faster, time its decode here and keep the fastest within the "
                                            "accuracy budget (default 1% perplexity over float32).")] = "float32",
    quantization: Annotated[str, typer.Option(help="none, auto (a GGUF stays quantized), int8, int4, fp8, w8a8, "
                                                   "w4a8 or a per-layer YAML/JSON config file.")] = "auto",
    accuracy_budget: Annotated[str | None, typer.Option(help="With one --quantization method: keep the layers "
                                                        "whose quantization raises perplexity on the calibration "
                                                        "text most in float, within this increase (e.g. 1%).")] = None,
    calibration: Annotated[list[Path] | None, typer.Option(help="Text file for the sensitivity pass (repeatable; "
                                                           "default: Python standard library sources).")] = None,
    target: Annotated[str, typer.Option(help="cpu or cuda: the device the engine will run on (cuda needs a GPU "
                                             "here; an engine runs only on its target).")] = "cpu",
    tune: Annotated[bool, typer.Option(help="Then time the runtime options here as `codeyard llm tune` does.")] = False,
    tune_seconds: Annotated[float, typer.Option(min=0, help="Time limit of --tune's trials.")] = 300.0,
) -> None:
    """Capture, transform, load and quantize SRC once; `LLM(model=ENGINE_DIR)` and `codeyard llm serve
    --model ENGINE_DIR` then load it without re-exporting."""
    from llm_engine.autodeploy.build import build_engine, parse_budget

    budget = None if accuracy_budget is None else parse_budget(accuracy_budget)
    report = build_engine(source, out, dtype, None if quantization == "none" else quantization, budget, calibration,
                          progress=typer.echo, target=target)
    for line in report.lines():
        typer.echo(line)
    if tune:
        _tune(out, budget, calibration, tune_seconds)
    typer.echo(f"wrote {out}; load it with LLM({str(out)!r}) or `codeyard llm serve --model {out}`")


def tune(
    engine: Annotated[Path, typer.Argument(metavar="ENGINE_DIR", help="An engine folder (`codeyard llm build`).")],
    accuracy_budget: Annotated[str, typer.Option(help="Largest perplexity increase over the engine's default "
                                                      "options a faster choice may cost.")] = "1%",
    calibration: Annotated[list[Path] | None, typer.Option(help="Text file for the perplexity check (repeatable; "
                                                           "default: Python standard library sources).")] = None,
    seconds: Annotated[float, typer.Option(min=0, help="Time limit of the trials (candidates not reached are "
                                                       "left out).")] = 300.0,
) -> None:
    """Time the engine's runtime options on this machine (attention backend, threads, KV block size,
    token budget) through the engine itself and record the fastest within the accuracy budget;
    LLM(ENGINE_DIR) and `codeyard llm serve` use them unless given others."""
    from llm_engine.autodeploy.build import parse_budget

    _tune(engine, parse_budget(accuracy_budget), calibration, seconds)


def _tune(engine: Path, budget: float | None, calibration: list[Path] | None, seconds: float) -> None:
    from llm_engine.engine_tune import BUDGET, tune_engine

    choice = tune_engine(engine, BUDGET if budget is None else budget, calibration, typer.echo, seconds)
    for line in choice.lines()[len(choice.trials):]:  # the trials were shown as they ran
        typer.echo(line)
