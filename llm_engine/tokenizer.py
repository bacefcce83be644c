"""The part of a Hugging Face tokenizer the engine and its servers use.

Transformers types `decode` and `convert_ids_to_tokens` for batches too (`str | list[str]`); the
engine only ever passes one sequence or one id, so this Protocol names the shapes it relies on,
and the loader casts the tokenizer it makes to it once.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from functools import lru_cache
from typing import Any, Protocol, cast


class Tokenizer(Protocol):
    eos_token_id: int | None

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any: ...  # a BatchEncoding

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def convert_ids_to_tokens(self, ids: int) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, Any]], *, tokenize: bool,
                            add_generation_prompt: bool) -> str: ...


def tokenize_prompt(tokenizer: Tokenizer | None, vocab_size: int,
                    prompt: str | list[int]) -> tuple[str | None, list[int]]:
    """(the text or None, the token ids) of a text or token-id prompt; ValueError names what is wrong.
    The engine and the engine-core process's API side check prompts the same way."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: this model has no tokenizer; pass token ids instead of text")
        return prompt, tokenizer(prompt).input_ids
    if not isinstance(prompt, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise ValueError("prompt: must be a string or a list of token ids")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    return None, list(prompt)


def token_count_bound(tokenizer: Tokenizer, text: str) -> int | None:
    """An upper bound on the number of tokens `tokenizer(text)` gives, without tokenizing; None
    where the tokenizer's kind gives none. A byte-level BPE (GPT-2's, SmolLM2's, Llama 3's) with
    no normalizer makes each token of at least one byte of the text (special tokens written in it
    of more), so the text's UTF-8 length, plus a prefix space it may add and the special tokens it
    adds around a text, bounds the count."""
    added = _byte_level_additions(cast(Hashable, tokenizer))
    return None if added is None else len(text.encode()) + added


@lru_cache(maxsize=8)
def _byte_level_additions(tokenizer: Any) -> int | None:
    """The tokens a byte-level BPE tokenizer may add to a text's bytes (1 for a prefix space, and
    its special tokens), or None for any other kind (a normalizer may lengthen the text;
    SentencePiece's byte fallback writes a character as up to 4 byte tokens after a prefix)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None or type(backend.model).__name__ != "BPE" \
            or backend.pre_tokenizer is None:
        return None
    pre = json.loads(backend.pre_tokenizer.__getstate__())  # its own JSON, not the whole vocabulary's
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = {step.get("type") for step in steps}
    if "ByteLevel" not in kinds or not kinds <= {"ByteLevel", "Split", "Digits", "Punctuation"}:
        return None
    specials: int = tokenizer.num_special_tokens_to_add(pair=False)
    return 1 + specials
