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
