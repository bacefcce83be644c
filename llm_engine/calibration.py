"""Calibration for GPTQ: local text (by default source files of the Python standard library this
interpreter runs, never a download), tokenized with the model's own tokenizer and run through the
float model with Transformers, collecting each linear layer's input second moments H = X^T X.

The moments come from one pass of the float model (not layer by layer through already-quantized
layers, as the GPTQ paper does): simpler and one forward pass, at some cost in accuracy.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch import nn

# Plain, varied Python; all in every CPython install.
_STDLIB_FILES = ("argparse.py", "textwrap.py", "functools.py", "json/decoder.py", "csv.py", "datetime.py",
                 "pathlib.py", "difflib.py", "heapq.py", "shlex.py")


def default_calibration_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [stdlib / name for name in _STDLIB_FILES if (stdlib / name).is_file()]


def calibration_batches(source: Path, files: list[Path], seq_len: int = 256, max_tokens: int = 4096
                        ) -> list[torch.Tensor]:
    """Token windows [1, seq_len] (at most max_tokens in all) from the files' text."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        raise ValueError(f"quantize: calibration needs the model's tokenizer in {source}") from None
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"quantize: calibration file {missing[0]} does not exist")
    ids_list: list[int] = []
    for file in files:  # only as much text as the windows take
        ids_list += tokenizer(file.read_text(errors="replace") + "\n\n", add_special_tokens=False)["input_ids"]
        if len(ids_list) >= max_tokens:
            break
    ids = torch.tensor(ids_list[:max_tokens])
    if ids.numel() < seq_len:
        raise ValueError(f"quantize: calibration text is {ids.numel()} tokens; at least {seq_len} are needed")
    return [ids[start:start + seq_len].unsqueeze(0) for start in range(0, ids.numel() - seq_len + 1, seq_len)]


def input_moments(source: Path, weight_names: set[str], batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """{weight name: X^T X [K, K]} (float32) over the calibration tokens, for the linear layers named;
    held for all layers at once (K^2 floats each)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=torch.float32)
    moments: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and f"{name}.weight" in weight_names:
            def accumulate(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor,
                           key: str = f"{name}.weight") -> None:
                x = args[0].reshape(-1, args[0].shape[-1]).float()
                moments[key] = moments.get(key, 0) + x.T @ x
            hooks.append(module.register_forward_hook(accumulate))
    with torch.no_grad():
        for batch in batches:
            model(batch)
    for hook in hooks:
        hook.remove()
    return moments
