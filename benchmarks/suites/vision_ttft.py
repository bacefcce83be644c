"""Time to first token with a repeated image vs a new one (the encoder-output and prefix caches).

A random-weight LLaVA-1.5-shaped model is built on the spot (nothing is downloaded): a CLIP
tower at 336 px with 14 px patches (576 image placeholders, as LLaVA-1.5), narrower and shallower
than CLIP-L so a 2-core CPU gets through it, and a small Llama decoder. Each round sends, one
request at a time and asking for one token:

- **new**: a picture never seen before, then a question;
- **repeat**: the same picture with another question (the picture's blocks come from the prefix
  cache, keyed by its hash, and its features would come from the encoder cache);
- **repeat-moved**: the same picture after different text (the prefix cache cannot help; only
  the encoder-output cache does).

Prints TTFT p50 per kind and the ratio to `new` (goal: repeats at least 30% lower), and the
encoder-cache counters.

    python -m benchmarks run vision-ttft              # 8 rounds
    python -m benchmarks run vision-ttft --rounds 3   # quicker
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from llm_engine import LLM, SamplingParams

GOAL = 0.70  # repeat TTFT / new TTFT at most this
IMAGE_TOKEN = 511


def build_model(folder: Path, vision_layers: int, vision_hidden: int) -> None:
    from transformers import AutoModelForImageTextToText, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=4 * vision_hidden,
                              num_hidden_layers=vision_layers, num_attention_heads=8, image_size=336, patch_size=14)
    text = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                       tie_word_embeddings=False)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN)
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}).save_pretrained(folder)


def photo(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (480, 640, 3), dtype=np.uint8))


def question(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, 24).tolist()


def ttft(llm: LLM, token_ids: list[int], image: Image.Image) -> float:
    params = SamplingParams(temperature=0, max_tokens=1)
    out = llm.generate({"prompt_token_ids": token_ids, "multi_modal_data": {"image": [image]}}, params,
                       use_tqdm=False)[0]
    return out.metrics.first_token_time - out.metrics.arrival_time


def parse_args(argv: list[str] | None, parser: argparse.ArgumentParser) -> argparse.Namespace:
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--vision-layers", type=int, default=12)
    parser.add_argument("--vision-hidden", type=int, default=512)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp), args.vision_layers, args.vision_hidden)
        llm = LLM(tmp, dtype="float32", kv_cache_memory="256MiB")
        ttft(llm, [1, IMAGE_TOKEN] + question(10_000), photo(10_000))  # warm-up
        times: dict[str, list[float]] = {"new": [], "repeat": [], "repeat-moved": []}
        for r in range(args.rounds):
            image = photo(r)
            times["new"].append(ttft(llm, [1, IMAGE_TOKEN] + question(3 * r), image))
            times["repeat"].append(ttft(llm, [1, IMAGE_TOKEN] + question(3 * r + 1), image))
            times["repeat-moved"].append(ttft(llm, [1] + question(3 * r + 2) + [IMAGE_TOKEN], image))
        stats = llm.engine.get_stats()
    new = statistics.median(times["new"])
    print(f"LLaVA-1.5 shape: CLIP {args.vision_layers} layers x {args.vision_hidden}, 336 px / 14 px "
          f"(576 placeholders); Llama 4 x 512; {args.rounds} rounds, one request at a time")
    print(f"{'kind':<14}{'TTFT p50 ms':>12}{'vs new':>9}")
    kinds = {}
    for kind, values in times.items():
        ratio = statistics.median(values) / new
        kinds[kind] = {"ttft_p50_ms": statistics.median(values) * 1000, "ttft_vs_new": ratio}
        print(f"{kind:<14}{statistics.median(values) * 1000:>12.1f}{ratio:>9.2f}"
              + ("" if kind == "new" else f"   goal <= {GOAL:.2f}: {'met' if ratio <= GOAL else 'NOT met'}"))
    print(f"encoder cache: {stats.mm_cache_queries} lookups, {stats.mm_cache_hits} hits; prefix cache: "
          f"{stats.prefix_cache_hits} of {stats.prefix_cache_queries} prompt tokens")
    return {"kinds": kinds, "encoder_cache": {"queries": stats.mm_cache_queries, "hits": stats.mm_cache_hits},
            "prefix_cache": {"hits": stats.prefix_cache_hits, "queries": stats.prefix_cache_queries}}


DIRECTIONS = {"ttft_p50_ms": False, "ttft_vs_new": False}


def figures(report: dict) -> dict[str, dict[str, float]]:
    return report["kinds"]
