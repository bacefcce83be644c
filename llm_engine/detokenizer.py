"""Incremental detokenization and stop-string detection.

Each step decodes only a short window of tokens: the text of tokens[prefix:] minus the text of
tokens[prefix:read], so multi-byte characters and leading spaces come out right. Stop strings are
searched in the new text plus the tail of the old text, so a stop split over tokens is found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from llm_engine.tokenizer import Tokenizer

_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.prefix_offset = max(len(prompt_token_ids) - _CONTEXT_TOKENS, 0)
        self.read_offset = len(prompt_token_ids)

    def decode_new(self, token_ids: list[int]) -> str:
        """Text added by the tokens after read_offset ('' while a character is incomplete)."""
        prefix = self.tokenizer.decode(token_ids[self.prefix_offset:self.read_offset],
                                       skip_special_tokens=self.skip_special_tokens)
        full = self.tokenizer.decode(token_ids[self.prefix_offset:],
                                     skip_special_tokens=self.skip_special_tokens)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
        return full[len(prefix):]


def find_stop_string(text: str, new_len: int, stops: list[str], include: bool) -> tuple[str, str] | None:
    """If a stop string ends within the last new_len characters, return (trimmed text, stop)."""
    best: tuple[int, str] | None = None
    for stop in stops:
        index = text.find(stop, max(0, len(text) - new_len - len(stop) + 1))
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop)
    if best is None:
        return None
    index, stop = best
    return text[:index + len(stop)] if include else text[:index], stop
