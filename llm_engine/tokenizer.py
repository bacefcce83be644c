"""The part of a Hugging Face tokenizer the engine and its servers use.

Transformers types `decode` and `convert_ids_to_tokens` for batches too (`str | list[str]`); the
engine only ever passes one sequence or one id, so this Protocol names the shapes it relies on,
and the loader casts the tokenizer it makes to it once.
"""

from __future__ import annotations

from typing import Any, Protocol


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
