"""GPTQ's error-compensating rounding (Frantar et al., 2022), for `codeyard llm quantize --method gptq`.

Columns (inputs) are rounded one at a time; each one's rounding error, weighted by the inverse of
the inputs' second moments H = X^T X from calibration text, is spread over the columns not yet
rounded, so the layer's outputs on such inputs move less than with plain rounding. Done in blocks
of one group (the group's scale is set from its columns as they stand when the block starts) with
the lazy update between blocks; act-order rounds the inputs with the largest H diagonal first.
"""

from __future__ import annotations

import torch

from llm_engine.layers.quantization_formats import grid, round_to_grid

DAMPING = 0.01  # of H's mean diagonal, added to the diagonal so that its Cholesky factor exists


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, bits: int, group: int | None, symmetric: bool,
                  act_order: bool = False, min_zero: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K], hessian [K, K] -> codes [K, N], zero points and float16 scales [groups, N] and
    g_idx [K] (each input's group), GPTQ's checkpoint tensors before packing."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one column at a time: small ops, which threads only slow down
    try:
        return _gptq(w, hessian, bits, group, symmetric, act_order, min_zero)
    finally:
        torch.set_num_threads(threads)


def _gptq(w: torch.Tensor, hessian: torch.Tensor, bits: int, group: int | None, symmetric: bool,
          act_order: bool, min_zero: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    n_out, k_in = w.shape
    weight, h = w.detach().double().clone(), hessian.double().clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    weight[:, dead] = 0
    perm = torch.argsort(h.diagonal(), descending=True) if act_order else torch.arange(k_in)
    weight, h = weight[:, perm], h[perm][:, perm]
    h.diagonal().add_(DAMPING * h.diagonal().mean())
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    block = group or 128
    codes = torch.zeros(n_out, k_in, dtype=torch.int32)
    scale_list, zero_list = [], []
    if group is None:
        scales, zeros = grid(weight.float(), bits, symmetric, min_zero)
        scale_list, zero_list = [scales], [zeros]
    for start in range(0, k_in, block):
        end = min(start + block, k_in)
        chunk, errors, h_chunk = weight[:, start:end].clone(), torch.zeros(n_out, end - start, dtype=torch.float64), \
            h_inv[start:end, start:end]
        if group is not None:
            scales, zeros = grid(chunk.float(), bits, symmetric, min_zero)
            scale_list.append(scales)
            zero_list.append(zeros)
        s, z = scales.double(), zeros.double()
        for i in range(end - start):
            q = round_to_grid(chunk[:, i], s, z, bits)
            codes[:, start + i] = q.to(torch.int32)
            error = (chunk[:, i] - (q - z) * s) / h_chunk[i, i]
            chunk[:, i:] -= error.unsqueeze(1) * h_chunk[i, i:].unsqueeze(0)
            errors[:, i] = error
        weight[:, end:] -= errors @ h_inv[start:end, end:]
    g_idx = torch.empty(k_in, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k_in) // block if group else torch.zeros(k_in, dtype=torch.int64)).to(torch.int32)
    unpermuted = torch.empty_like(codes)
    unpermuted[:, perm] = codes
    return (unpermuted.t().contiguous(), torch.stack(zero_list).contiguous(),
            torch.stack(scale_list).contiguous(), g_idx)
