"""Compile the attention kernels for CUDA GPUs on a machine without one: Triton's compiler down to a
cubin with its own ptxas, for each sm_<arch> given (`python triton_compile_check.py 80 90`).

Each kernel is specialized as the launchers specialize it for Llama-3-8B's attention (32 heads, 8 kv
heads, head_dim 128) in bf16 and fp16: decodes (each config the tuner may pick) with and without
split-K, a mixed batch, the combine and the cache write; each must fit the 99 KiB of shared memory of the smallest sm_8x GPUs. Run it
with TRITON_INTERPRET unset or 0 (test_triton_attention.py does, under `make test-triton-compile`).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from llm_engine.kernels import attention, kv_cache

SHARED_MEMORY_LIMIT = 99 * 1024


def compile_for_cuda(kernel: Any, types: dict[str, str], constants: dict[str, Any], arch: int,
                     num_warps: int = 4) -> Any:
    signature = {name: "constexpr" if name in constants else types.get(name, "i32") for name in kernel.arg_names}
    compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps})
    if "cubin" not in compiled.asm or compiled.metadata.shared > SHARED_MEMORY_LIMIT:
        raise SystemExit(f"{kernel.__name__} {constants}: no cubin or {compiled.metadata.shared} bytes of shared memory")
    return compiled


def compile_all(arch: int) -> None:
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        pointers = {n: f"*{name}" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
        pointers.update({n: "*i32" for n in ("block_tables_ptr", "query_start_ptr", "seq_lens_ptr", "tile_seq_ptr",
                                             "tile_row_ptr")}, part_out_ptr="*fp32", part_lse_ptr="*fp32", scale="fp32")
        for query_lens in ([1] * 64, [300, 1, 130]):
            batch = attention.PagedBatch.build(query_lens, [2048] * len(query_lens), [[0]] * len(query_lens),
                                               torch.device("cpu"))
            # decodes: every config the tuner may pick, with and without split-K; mixed batches: the default
            configs = attention._DECODE_TUNER.candidates if batch.decode_only else [attention._DECODE_TUNER.default]
            for split in (False, True) if batch.decode_only else (False,):
                for config in configs:
                    constants = {**attention.tile_sizes(32, 8, 128, batch), "BLOCK_N": config["BLOCK_N"],
                                 "SPLIT": split, "DOT_DTYPE": attention._TL_DTYPES[dtype], "PAGE": 16}
                    compiled = compile_for_cuda(attention._paged_attention_kernel, pointers, constants, arch,
                                                config["num_warps"])
                    print(f"sm_{arch} {name} attention {constants['BLOCK_Q']} query rows/tile, split {split}, "
                          f"{config}: {compiled.metadata.shared} bytes shared", flush=True)
        compile_for_cuda(attention._combine_splits_kernel,
                         {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": f"*{name}"},
                         {"BLOCK_S": 16, "BLOCK_D": 128}, arch)
        compile_for_cuda(kv_cache._reshape_and_cache_kernel,
                         {**{n: f"*{name}" for n in ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr")}, "slot_ptr": "*i64"},
                         {"BLOCK_H": 8, "BLOCK_D": 128}, arch)
    print(f"sm_{arch}: all kernels compiled", flush=True)


if __name__ == "__main__":
    if attention.INTERPRETED:
        raise SystemExit("run with TRITON_INTERPRET unset or 0: interpreted kernels do not compile")
    for arch in sys.argv[1:] or ["80", "90"]:
        compile_all(int(arch))
