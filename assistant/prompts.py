"""Prompts for the assistant, built from what the editor sends, and the ghost text cut from a completion.

The built-in SmolLM2 has no fill-in-the-middle tokens, so a completion prompt is plain text: the
other open files (each under a comment naming it), then the current file up to the cursor. Each
part is trimmed to a character budget, keeping the text nearest the cursor (or, for a run's
output, its end, where tracebacks are), so prompts stay short and answers fast on a CPU.
The model reads and writes code indented by four spaces (as most Python it learnt from), so code
indented otherwise in the editor is re-indented on the way in and the suggestion on the way out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

# OpenAI's {"role": ..., "content": ...}; content is a list of parts when the message shows images
ChatMessage = dict[str, Any]

PREFIX_CHARS = 2000
OTHER_FILE_CHARS = 600
OTHER_FILES = 3
FILE_CHARS = 3000
OUTPUT_CHARS = 2000

_HASH_COMMENTS = {".py", ".sh", ".rb", ".toml", ".yaml", ".yml", ".r", ".pl", ""}
MODEL_INDENT = "    "
TAB_COLUMNS = 4
CONTINUE = "Continue your answer from exactly where it stopped, without repeating any of it."
SYSTEM = ("You are a helpful programming assistant inside a code editor. "
          "Answer briefly and concretely, for a student.")


def _comment(path: str) -> str:
    return "#" if PurePosixPath(path).suffix.lower() in _HASH_COMMENTS else "//"


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n…"


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def completion_prompt(path: str, prefix: str, others: list[tuple[str, str]]) -> str:
    """Other open files first (the nearest context last), then the current file up to the cursor."""
    parts = [f"{_comment(p)} file: {p}\n{_head(text, OTHER_FILE_CHARS)}\n" for p, text in others[:OTHER_FILES] if p != path]
    parts.append(f"{_comment(path)} file: {path}\n{_tail(prefix, PREFIX_CHARS)}")
    return "\n".join(parts)


def ghost_text(generated: str, line_after_cursor: str) -> str:
    """The part of a completion to show: the rest of the current line, or (when the model ends the
    line first) the next line. Markdown fences end it; text already right of the cursor is dropped."""
    text = generated.split("```", 1)[0]
    rest = text.lstrip("\n")
    newlines = text[: len(text) - len(rest)]
    line = rest.split("\n", 1)[0].rstrip()
    if newlines:
        return newlines + line if line.strip() else ""
    after = line_after_cursor.strip()
    if after and line.endswith(after):
        line = line[: len(line) - len(after)].rstrip()
    return line


def reindent(text: str, unit: str, to: str, first_line: bool = True) -> str:
    """Each line's leading whitespace, read as levels of `unit`, written as levels of `to` (columns left over
    stay spaces). first_line=False leaves the first line alone (a suggestion that goes on after code)."""
    width = len(unit.expandtabs(TAB_COLUMNS))
    lines = text.split("\n")
    for index in range(0 if first_line else 1, len(lines)):
        body = lines[index].lstrip(" \t")
        levels, rest = divmod(len(lines[index][: len(lines[index]) - len(body)].expandtabs(TAB_COLUMNS)), width)
        lines[index] = to * levels + " " * rest + body
    return "\n".join(lines)


def line_is_complete(generated: str) -> bool:
    """Whether more tokens can no longer change `ghost_text` (so generation can stop)."""
    return "```" in generated or "\n" in generated.lstrip("\n")


def _file_block(path: str, content: str) -> str:
    return f"File `{path}`:\n```\n{_head(content, FILE_CHARS)}\n```"


def explain_messages(path: str, content: str, output: str,
                     failing: tuple[int, str] | None = None) -> list[ChatMessage]:
    """Chat messages asking why a run failed, with the program, the end of its output and the line
    the error points at (a small model finds it in a long file less reliably than we do)."""
    at = f"The error points at line {failing[0]}:\n```\n{failing[1].strip()}\n```\n\n" if failing else ""
    question = (f"{_file_block(path, content)}\n\nRunning it printed:\n```\n{_tail(output, OUTPUT_CHARS)}\n```\n\n"
                f"{at}Explain this error in two or three sentences and say how to fix it.")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _content(text: str, images: Sequence[str]) -> str | list[dict[str, Any]]:
    """A message's text, with its images (data: URLs) as OpenAI's `image_url` parts."""
    if not images:
        return text
    return [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": url}} for url in images)]


def chat_messages(path: str, content: str, conversation: Sequence[tuple[str, str, Sequence[str]]]
                  ) -> list[ChatMessage]:
    """The conversation so far (role, text, images), with the current file given to the model up front."""
    context = f"The student is working on this file.\n\n{_file_block(path, content)}"
    return ([{"role": "system", "content": f"{SYSTEM}\n\n{context}"}]
            + [{"role": role, "content": _content(text, images)} for role, text, images in conversation])


def continued(messages: list[ChatMessage], answer: str) -> list[ChatMessage]:
    """The messages of an answer that the length cap cut short, asking for the rest of it."""
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": CONTINUE}]
