"""Tiny random-weight vision-language models built with transformers on the spot, test pictures
in each format, and Transformers' greedy reference for prompts with images."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    CLIPImageProcessor,
    CLIPVisionConfig,
    Idefics3Config,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    Idefics3VisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaNextConfig,
    LlavaNextImageProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionImageProcessor,
    PreTrainedTokenizerFast,
    Qwen2Config,
    SiglipImageProcessor,
    SiglipVisionConfig,
)

VOCAB = 320
IMAGE_TOKEN = VOCAB - 1
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1, bos_token_id=1,
            eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
CLIP_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                   image_size=30, patch_size=6, projection_dim=32, initializer_range=0.2)


GRID = [[30, 60], [60, 30], [60, 60], [90, 30]]  # LLaVA-NeXT tilings (height, width), 30 px tiles
CLIP_SIZES = dict(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30})
PROCESSORS = {  # the image processor each builder saves: CLIP's resize and crop, SigLIP's fixed size, and tiles
    "llava": lambda: CLIPImageProcessor(**CLIP_SIZES),
    "llava_next": lambda: LlavaNextImageProcessor(**CLIP_SIZES, image_grid_pinpoints=GRID),
    "siglip": lambda: SiglipImageProcessor(size={"height": 30, "width": 30}),
    "llava_onevision": lambda: LlavaOnevisionImageProcessor(size={"height": 30, "width": 30}, image_grid_pinpoints=GRID),
}


def build_llava(folder: Path, next_version: bool = False) -> Path:
    """LLaVA-1.5 shape (or NeXT with any-resolution tiles): CLIP tower (30 px pictures, 6 px
    patches: 25 features a tile), Llama decoder."""
    config_class = LlavaNextConfig if next_version else LlavaConfig
    extra = dict(image_grid_pinpoints=GRID) if next_version else {}
    config = config_class(vision_config=CLIPVisionConfig(**CLIP_VISION), text_config=LlamaConfig(**TEXT),
                          image_token_index=IMAGE_TOKEN, projector_hidden_act="gelu", **extra)
    config.architectures = ["LlavaNextForConditionalGeneration" if next_version else "LlavaForConditionalGeneration"]
    torch.manual_seed(1234)
    AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(folder)
    PROCESSORS["llava_next" if next_version else "llava"]().save_pretrained(folder)
    return folder


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = ["What is in this plot? The axes show the sine of x.", "def area(radius):\n    return 3.14 * radius ** 2\n",
          "You are a helpful programming assistant inside a code editor. Answer briefly and concretely."]


def tiny_bpe(specials: list[str], corpus: list[str]) -> Tokenizer:
    """A byte-level BPE trained here on a few lines, in milliseconds. Its bytes are ASCII's (others
    are dropped), so whatever tokens a random model picks decode to text."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    ascii_bytes = sorted({c for word, _ in bpe.pre_tokenizer.pre_tokenize_str("".join(map(chr, range(128))))
                          for c in word})
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=ascii_bytes))
    return bpe


def tiny_chat_tokenizer() -> PreTrainedTokenizerFast:
    """ChatML's template and an `<image>` token over `tiny_bpe`: a chat tokenizer in milliseconds
    (SmolLM2's, read from its GGUF file, takes seconds)."""
    bpe = tiny_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>"], CORPUS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", additional_special_tokens=["<image>"])
    tokenizer.chat_template = CHATML
    return tokenizer


def build_llava_chat(folder: Path, tokenizer) -> Path:
    """A LLaVA-1.5 shape that chats: `tokenizer` (SmolLM2's, chat template included) plus an `<image>`
    token, a 2-layer Llama decoder over its vocabulary, the CLIP tower above (25 features a picture)."""
    tokenizer.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)  # a copy: the caller's tokenizer stays as it is
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.save_pretrained(folder)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**CLIP_VISION), text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(3)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # logits far apart: sampled at a low temperature, an answer starts the same way every run
        model.get_output_embeddings().weight.mul_(25)
    model.save_pretrained(folder)
    PROCESSORS["llava"]().save_pretrained(folder)
    return folder


def build_llava_siglip(folder: Path) -> Path:
    """LLaVA-Interleave shape: a SigLIP tower (no class token, 25 features) and a Qwen2 decoder."""
    vision = {k: v for k, v in CLIP_VISION.items() if k != "projection_dim"}
    text = {k: v for k, v in TEXT.items() if k != "tie_word_embeddings"}
    config = LlavaConfig(vision_config=SiglipVisionConfig(**vision),
                         text_config=Qwen2Config(**text, tie_word_embeddings=True), image_token_index=IMAGE_TOKEN,
                         vision_feature_select_strategy="full", vision_feature_layer=-1)
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(4321)
    AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(folder)
    PROCESSORS["siglip"]().save_pretrained(folder)
    return folder


def build_llava_onevision(folder: Path) -> Path:
    """LLaVA-OneVision shape: SigLIP, Qwen2, NeXT tiles; `anyres_max_1` so that maps of more than
    one tile's features get shrunk."""
    vision = {k: v for k, v in CLIP_VISION.items() if k != "projection_dim"}
    text = {k: v for k, v in TEXT.items() if k != "tie_word_embeddings"}
    config = LlavaOnevisionConfig(vision_config=SiglipVisionConfig(**vision),
                                  text_config=Qwen2Config(**text, tie_word_embeddings=True),
                                  image_token_index=IMAGE_TOKEN, image_grid_pinpoints=GRID,
                                  vision_aspect_ratio="anyres_max_1", vision_feature_select_strategy="full",
                                  vision_feature_layer=-1)
    config.architectures = ["LlavaOnevisionForConditionalGeneration"]
    torch.manual_seed(99)
    AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(folder)
    PROCESSORS["llava_onevision"]().save_pretrained(folder)
    return folder


IDEFICS3_TOKENS = ["<|endoftext|>", "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                   *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]


def idefics3_processor(folder: Path, split: bool = True) -> Idefics3Processor:
    """Idefics3's processor: a tokenizer with its layout tokens ("\n\n" one token, as in SmolVLM's), pictures
    resized to a 60 px longest edge and cut into 30 px tiles (or squeezed into one without splitting)."""
    bpe = tiny_bpe(IDEFICS3_TOKENS, CORPUS + ["Question:\n\nAnswer:\n\n"] * 20)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<end_of_utterance>",
                                        pad_token="<|endoftext|>", additional_special_tokens=IDEFICS3_TOKENS[1:])
    images = Idefics3ImageProcessorPil(size={"longest_edge": 60}, max_image_size={"longest_edge": 30},
                                       do_image_splitting=split)
    processor = Idefics3Processor(images, tokenizer, image_seq_len=9)
    processor.save_pretrained(folder)
    return processor


def build_idefics3(folder: Path) -> Path:
    """Idefics3 / SmolVLM shape: its SigLIP-like tower (30 px tiles, 5 px patches: 36 patch states,
    9 features after the 2x pixel shuffle), the connector, a Llama decoder."""
    tokenizer = idefics3_processor(folder).tokenizer
    vision = Idefics3VisionConfig(**{k: v for k, v in CLIP_VISION.items() if k != "projection_dim"} | {"patch_size": 5})
    config = Idefics3Config(vision_config=vision, text_config=LlamaConfig(**TEXT | {"vocab_size": len(tokenizer)}),
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2)
    config.architectures = ["Idefics3ForConditionalGeneration"]
    torch.manual_seed(77)
    AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def idefics3_reference(folder: Path, text: str, images: list[Image.Image],
                       max_new_tokens: int) -> tuple[list[int], list[int], list[float]]:
    """(the processor's prompt ids, greedy tokens, their logprobs) from transformers for a prompt with
    one `<image>` per picture."""
    processor = AutoProcessor.from_pretrained(folder)
    inputs = processor(text=[text], images=[images] if images else None, return_tensors="pt")
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    prompt = inputs["input_ids"][0].tolist()
    tokens = out.sequences[0, len(prompt):].tolist()
    return prompt, tokens, [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, tokens)]


def picture(width: int, height: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    # smooth gradients plus noise: resizing then means something, unlike pure noise
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], -1)
    noise = rng.integers(0, 60, (height, width, 3))
    return Image.fromarray(((base + noise) % 256).astype(np.uint8)).convert(mode)


def encode(image: Image.Image, fmt: str, **save_kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save_kwargs)
    return buffer.getvalue()


def hf_reference(folder: Path, token_ids: list[int], images: list[Image.Image], num_features: list[int],
                 max_new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs from transformers: the prompt with each image token
    expanded, and the image processor's pixel values (images given upright, as the engine
    makes them)."""
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    expanded: list[int] = []
    features = iter(num_features)
    for token in token_ids:
        expanded.extend([token] * next(features) if token == IMAGE_TOKEN else [token])
    kwargs = {}
    if images:
        # one list per prompt: LLaVA-OneVision lays out several pictures differently from one
        kwargs.update(AutoImageProcessor.from_pretrained(folder)([images], return_tensors="pt"))
    with torch.no_grad():
        out = model.generate(torch.tensor([expanded]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True, **kwargs)
    tokens = out.sequences[0, len(expanded):].tolist()
    return tokens, [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, tokens)]


def bomb_png(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose header claims width x height (decoding it would need gigabytes)."""
    data = bytearray(encode(Image.new("RGB", (1, 1)), "PNG"))
    ihdr = 8 + 4  # after the signature and the chunk length
    data[ihdr + 4:ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17:ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr:ihdr + 17])))
    return bytes(data)
