"""Tensor-parallel group state. The layers ask here for their rank and size: a process that never
joined a group (the engine itself, tensor_parallel_size 1) is rank 0 of 1."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist


def init_tp_group(rank: int, world_size: int, init_method: str, timeout_s: float = 120.0) -> None:
    """Join the gloo group of a tensor-parallel worker; a peer that never comes (or stops
    answering inside a collective) fails it after `timeout_s`."""
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def get_tp_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def get_tp_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(x: torch.Tensor, op: Literal["sum", "max"] = "sum") -> torch.Tensor:
    """`x` summed (or its largest entries) over the ranks, in place."""
    if get_tp_size() > 1:
        dist.all_reduce(x, dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    if get_tp_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(get_tp_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)
