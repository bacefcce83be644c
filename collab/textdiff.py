"""Turn "the text is now X" into a small set of CRDT edits, so concurrent edits survive.

Diffs are computed on Python strings (code points); pycrdt's Text indexes UTF-8 bytes, so
offsets are converted before editing. Clients (Yjs, CodeMirror) count UTF-16 units, but they
never see our offsets: the CRDT items carry identity, not positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

from pycrdt import Text

# Above this many characters in one changed block, replace the block instead of diffing characters.
CHAR_DIFF_LIMIT = 4000


@dataclass(frozen=True)
class Edit:
    """Replace old[start:end] (code point offsets into the old text) with `insert`."""

    start: int
    end: int
    insert: str


def text_edits(old: str, new: str) -> list[Edit]:
    """Edits that turn old into new, in ascending order and non-overlapping."""
    prefix = 0
    limit = min(len(old), len(new))
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    old_mid = old[prefix : len(old) - suffix]
    new_mid = new[prefix : len(new) - suffix]
    if not old_mid and not new_mid:
        return []
    if not old_mid or not new_mid:
        return [Edit(prefix, prefix + len(old_mid), new_mid)]
    return [
        Edit(prefix + edit.start, prefix + edit.end, edit.insert)
        for edit in _line_edits(old_mid, new_mid)
    ]


def _line_edits(old: str, new: str) -> list[Edit]:
    old_lines = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    old_starts = _line_starts(old_lines)
    new_starts = _line_starts(new_lines)
    edits = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        start, end = old_starts[i1], old_starts[i2]
        insert = new[new_starts[j1] : new_starts[j2]]
        if tag == "replace" and end - start + len(insert) <= CHAR_DIFF_LIMIT:
            edits.extend(_char_edits(old[start:end], insert, start))
        else:
            edits.append(Edit(start, end, insert))
    return edits


def _char_edits(old: str, new: str, offset: int) -> list[Edit]:
    return [
        Edit(offset + i1, offset + i2, new[j1:j2])
        for tag, i1, i2, j1, j2 in SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
        if tag != "equal"
    ]


def _line_starts(lines: list[str]) -> list[int]:
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    return starts


def utf8_offset(text: str, index: int) -> int:
    """Byte offset in UTF-8 of code point `index` (the unit pycrdt's Text uses)."""
    return len(text[:index].encode("utf-8"))


def apply_text(ytext: Text, new: str) -> None:
    """Edit ytext (inside the caller's transaction) until it reads `new`."""
    old = str(ytext)
    for edit in reversed(text_edits(old, new)):
        start = utf8_offset(old, edit.start)
        end = utf8_offset(old, edit.end)
        if end > start:
            del ytext[start:end]
        if edit.insert:
            ytext.insert(start, edit.insert)
