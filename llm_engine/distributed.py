"""Tensor-parallel group state. Single process today (tp_size == 1); layers already ask here."""

from __future__ import annotations

import torch
import torch.distributed as dist


def get_tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if get_tp_size() > 1:
        dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    if get_tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(get_tp_size())]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=-1)
