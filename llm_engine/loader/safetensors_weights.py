"""Stream tensors from a folder of safetensors files (single file or sharded with an index)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / shard for shard in shards]
    return sorted(folder.glob("*.safetensors"))


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = safetensors_files(folder)
    if not files:
        raise ValueError(f"model: no .safetensors weights in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
