"""How many KV blocks fit on the GPU: vLLM's `gpu_memory_utilization`, measured by a profiled forward.

The engine may use `total × gpu_memory_utilization` bytes of the GPU. Besides the KV pool it needs
its weights, the activation peak of the largest step (a prefill of `max_num_batched_tokens`
tokens, and the sampler's sort of `max_num_seqs` rows of logits), and memory outside PyTorch's
allocator (the CUDA context's growth, cuBLAS workspaces). The runner runs that largest step once
over a scratch pool, reads PyTorch's peak, and gives the rest to the pool. Memory that other
processes hold is not ours to count, but it may leave less free than the share asks for: that is
an error naming the option, not an out-of-memory later. CUDA graphs, captured after the pool is
allocated, take their (small, decode-sized) memory from the share left over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MemoryProfile:
    total: int  # the device's memory
    used_before: int  # in use before the engine loaded anything (other processes, our context)
    peak_torch: int  # PyTorch's peak during the profile (weights + activations), scratch pool excluded
    non_torch: int  # memory the engine took outside PyTorch's allocator
    free_after: int  # free now, the profile's memory released


def kv_cache_bytes(profile: MemoryProfile, utilization: float) -> int:
    """The pool's budget; a ValueError naming gpu_memory_utilization when it cannot be met."""
    gib = 1024**3
    share = int(profile.total * utilization)
    budget = share - profile.peak_torch - profile.non_torch
    if budget <= 0:
        raise ValueError(f"gpu_memory_utilization: {utilization} of {profile.total / gib:.1f} GiB leaves nothing "
                         f"for the KV cache (weights and activations take {profile.peak_torch / gib:.1f} GiB); "
                         f"raise it, or lower max_num_batched_tokens")
    if budget > profile.free_after:
        raise ValueError(f"gpu_memory_utilization: {utilization} asks for {budget / gib:.1f} GiB of KV cache but "
                         f"only {profile.free_after / gib:.1f} GiB is free (other processes use "
                         f"{profile.used_before / gib:.1f} GiB of this GPU); lower it")
    return budget


def measure(device: torch.device, used_before: int, scratch_bytes: int) -> MemoryProfile:
    """After the profiled forward, its scratch pool freed and the allocator's cache emptied:
    PyTorch's peak without the scratch pool, and the memory used outside PyTorch."""
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - scratch_bytes
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, (total - free) - used_before - torch.cuda.memory_reserved(device))
    return MemoryProfile(total, used_before, peak, non_torch, free)


def used_now(device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)
