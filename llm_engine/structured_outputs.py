"""Structured outputs: constrain sampling to a JSON schema, a regex, a list of choices or a grammar.

Each constrained request's constraint is compiled once by xgrammar (its compiler caches compiled
grammars by their text and options, so a repeated schema costs nothing) against the engine's
tokenizer; each of its sequences then walks its own matcher, which yields a bitmask of the tokens
allowed next. The sampler masks that sequence's logits row only; the matcher advances on every
token appended and the sequence ends when the grammar is complete. A speculative draft is walked
through the matcher before the forward (cut at the first token the grammar rejects, each verify
row's mask filled at its own prefix) and the matcher rolled back, so verification masks every row
as the one-token steps would have. xgrammar loads only when the
first constrained request arrives (it takes seconds to import).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import xgrammar


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint, in vLLM's vocabulary: `json` (a JSON schema, dict or text),
    `regex`, `choice` (one of these strings), `grammar` (xgrammar EBNF) or `json_object` (any
    JSON object). `whitespace_flexible`: allow any whitespace between JSON tokens (vLLM's
    default); off, the JSON is written compactly, which keeps small models from looping on
    spaces."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_flexible: bool = False

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs: give exactly one of json, regex, choice, grammar, "
                             f"json_object; got {given or 'none'}")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError("structured_outputs: json must be a JSON schema (an object or its text)")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs: {name} must be a non-empty string")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs: choice must be a non-empty list of non-empty strings")

    def key(self) -> tuple[str, str]:
        """(kind, text) of the constraint, what the compiler compiles."""
        if self.json is not None:
            return "json", self.json if isinstance(self.json, str) else json.dumps(self.json)  # keeps property order
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:  # a grammar of quoted literals: JSON escapes are EBNF's too
            return "grammar", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in self.choice)
        if self.grammar is not None:
            return "grammar", self.grammar
        return "json_object", '{"type": "object"}'  # any object, with any properties


# xgrammar's errors start with "[time] file.cc:line: " and sometimes "Check failed: (...) is false: ".
_NATIVE_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s+(Check failed: .*? is false: )?")


# xgrammar writes the characters of a string with minLength/maxLength as this class, which lets
# raw control characters in (invalid JSON); its unbounded strings use the right class.
_BOUNDED_CHAR, _JSON_CHAR = r"[^\"\\\r\n]", r"[^\0-\x1f\"\\\r\n]"
_KIND_NAMES = {"json": "JSON schema", "regex": "regex", "grammar": "grammar", "json_object": "JSON object"}


def _reason(exc: Exception) -> str:
    return _NATIVE_PREFIX.sub("", str(exc)).strip().splitlines()[0][:300]


class GrammarCompiler:
    """Compiles constraints against one tokenizer and model vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: set[int]) -> None:
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=sorted(stop_token_ids))
        self.vocab_size = vocab_size
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=2)

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        """The compiled constraint; ValueError naming what is wrong with it."""
        kind, text = params.key()
        try:
            if kind in ("json", "json_object"):
                if not isinstance(json.loads(text), dict):
                    raise ValueError("a JSON schema must be an object")
                grammar = self._xgr.Grammar.from_json_schema(text, any_whitespace=params.whitespace_flexible,
                                                             strict_mode=kind == "json")
                compiled = self._compiler.compile_grammar(str(grammar).replace(_BOUNDED_CHAR, _JSON_CHAR))
            elif kind == "regex":
                compiled = self._compiler.compile_regex(text)
            else:
                compiled = self._compiler.compile_grammar(text)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"structured_outputs: invalid {_KIND_NAMES[kind]}: {_reason(exc)}") from None
        return Grammar(self._xgr, compiled, self.vocab_size)


class Grammar:
    """A compiled constraint; each sequence under it gets its own GrammarState."""

    def __init__(self, xgr: Any, compiled: xgrammar.CompiledGrammar, vocab_size: int) -> None:
        self._xgr = xgr
        self._compiled = compiled
        self.vocab_size = vocab_size

    def new_state(self) -> GrammarState:
        return GrammarState(self._xgr.GrammarMatcher(self._compiled), self.vocab_size)


class GrammarState:
    """One sequence's position in its grammar."""

    def __init__(self, matcher: xgrammar.GrammarMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._draft_bitmask: torch.Tensor | None = None  # the masks of the rows verifying the last draft

    def accept(self, token: int) -> bool:
        """Advance past a sampled token; False if the grammar does not allow it."""
        return bool(self._matcher.accept_token(token))

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted."""
        return bool(self._matcher.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def check_draft(self, draft: list[int]) -> list[int]:
        """The longest prefix of a speculative draft that the grammar allows, cut before a token
        that would end the grammar (its stop token is the target's to give: a row after it would
        allow nothing). Fills each verify row's mask now, before the forward: row i is the mask
        after the prefix draft[:i]. The matcher is rolled back to where it was."""
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(len(draft) + 1, self.vocab_size)
        masks = bitmask.numpy()
        kept = 0
        for token in draft:
            self._matcher.fill_next_token_bitmask(bitmask, kept)
            if not (int(masks[kept, token >> 5]) >> (token & 31)) & 1 or not self._matcher.accept_token(token):
                break
            if self._matcher.is_terminated():
                self._matcher.rollback(1)
                break
            kept += 1
        else:
            self._matcher.fill_next_token_bitmask(bitmask, kept)
        if kept:
            self._matcher.rollback(kept)
        self._draft_bitmask = bitmask[:kept + 1]
        return draft[:kept]

    def mask_draft_rows(self, logits: torch.Tensor) -> None:
        """Set to -inf, in place, what the grammar forbids in each row verifying the draft that
        `check_draft` kept (logits: [verified draft tokens + 1, vocab]; the scheduler may have
        shortened the draft, which leaves the first rows' masks as they were)."""
        import xgrammar

        assert self._draft_bitmask is not None and logits.shape[0] <= self._draft_bitmask.shape[0]
        xgrammar.apply_token_bitmask_inplace(logits, self._draft_bitmask[:logits.shape[0]],
                                             vocab_size=min(self.vocab_size, logits.shape[-1]))


def apply_grammar_masks(logits: torch.Tensor, rows: list[int], states: list[GrammarState]) -> None:
    """Set to -inf, in place, every token the row's grammar forbids (only the given rows)."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(rows), states[0].vocab_size)
    vocab_size = min(states[0].vocab_size, logits.shape[-1])
    for i, (row, state) in enumerate(zip(rows, states)):
        state.fill(bitmask, i)
        # On a view of the row: indexing with a list would copy (and writing back is slow).
        xgrammar.apply_token_bitmask_inplace(logits[row:row + 1], bitmask[i:i + 1], vocab_size=vocab_size)
