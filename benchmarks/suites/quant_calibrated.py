"""The throughput suite's calibrated perplexity rows: AWQ and GPTQ checkpoints written by our own
`codeyard llm quantize` from the built-in GGUF's dequantized floats, on its default calibration
text, to set beside round-to-nearest int4 at the same group sizes (issue 16).

The float folder and the checkpoints are written once under a temporary folder per run: the
CLI needs a Hugging Face folder, and writing it from the GGUF takes seconds, the GPTQ and AWQ
passes minutes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

# (label, --method, --group-size): 4 bits, tables float (as the RTN rows keep them). SmolLM2's 576
# inputs are not a multiple of 128, so g128 rows end each row in a 64-input group (--partial-groups),
# as the RTN g128 rows do.
CALIBRATED_ROWS = [("gptq g64", "gptq", 64), ("gptq g128", "gptq", 128),
                   ("awq g64", "awq", 64), ("awq g128", "awq", 128)]
# the round-to-nearest rows (throughput.QUANT_ROWS) each calibrated row is set against, by group
RTN_ROWS = {64: ("int4 g64 sym", "int4 g64 asym"), 128: ("int4 g128 sym", "int4 g128 asym")}
# "clearly better": at most this share of the better RTN row's perplexity excess over bf16
CALIBRATED_GOAL = 0.5
OVERLAP_TOKENS = 32  # a run of this many tokens shared by calibration and evaluation text is an overlap


def dequantized_folder(gguf: Path, folder: Path) -> Path:
    """The GGUF's weights dequantized to float32 by Transformers, saved as a Hugging Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (folder / "config.json").is_file():
        return folder
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # Transformers marks GGUF-loaded models unsaveable
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    return folder


def quantized_checkpoint(source: Path, method: str, group: int, out: Path) -> Path:
    """`codeyard llm quantize SOURCE --method M --group-size G` into `out`, in a child process
    (the command as a user runs it; its progress goes to stderr)."""
    if not (out / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "ide_server.cli", "llm", "quantize", str(source), "--out", str(out),
                        "--method", method, "--group-size", str(group), "--tables", "float", "--partial-groups"],
                       check=True, stdout=sys.stderr)
    return out


def check_held_out(source: Path, evaluation: list[int]) -> int:
    """Raises SystemExit if the default calibration text shares a run of OVERLAP_TOKENS tokens with
    the evaluation tokens; returns the number of calibration tokens compared."""
    from llm_engine.calibration import calibration_batches, default_calibration_files

    calibration = torch.cat(calibration_batches(source, default_calibration_files()), dim=1)[0].tolist()
    runs = {tuple(calibration[i:i + OVERLAP_TOKENS]) for i in range(len(calibration) - OVERLAP_TOKENS + 1)}
    shared = sum(tuple(evaluation[i:i + OVERLAP_TOKENS]) in runs
                 for i in range(len(evaluation) - OVERLAP_TOKENS + 1))
    if shared:
        raise SystemExit(f"calibration text overlaps the evaluation text ({shared} shared runs of "
                         f"{OVERLAP_TOKENS} tokens): the calibrated rows would not be held out")
    return len(calibration)


def verdicts(rows: dict[str, float], base: float) -> dict[str, tuple[float, bool]]:
    """Per calibrated row present with its RTN rows: (its excess over `base` as a share of the
    better RTN row's, goal met)."""
    out = {}
    for label, _, group in CALIBRATED_ROWS:
        rtn = [rows[r] for r in RTN_ROWS[group] if r in rows]
        if label in rows and rtn and min(rtn) > base:
            share = (rows[label] - base) / (min(rtn) - base)
            out[label] = (share, share <= CALIBRATED_GOAL)
    return out
