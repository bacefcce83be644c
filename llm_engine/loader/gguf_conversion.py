"""Transformers' conversion of a GGUF file's metadata into a config and a tokenizer, kept on disk.

Transformers reads a GGUF's metadata (a 49k-token vocabulary and its merges for SmolLM2) through
the `gguf` package's pure-Python reader, once for the config and again for the tokenizer: ~10 s
each on a 2-core machine, every time a server starts. The converted files (config.json and the
tokenizer's files) are saved once under the cache folder, named by the GGUF's path, size and
modification time and the Transformers version, and later loads read those in well under a second.
A cache that cannot be written costs nothing but the saving: the conversion is used directly.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from llm_engine.cache_dir import cache_root

log = logging.getLogger(__name__)

_DONE = ".complete"  # written last: a folder without it is a conversion cut short


def converted_folder(gguf: Path) -> Path:
    """Where the conversion of this exact file (path, size, mtime, Transformers version) lives."""
    import transformers

    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return cache_root() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:24]


def config_and_tokenizer(gguf: Path) -> tuple[Any, Any]:
    """The GGUF's Transformers config and tokenizer, converted once and then read from the cache."""
    from transformers import AutoConfig, AutoTokenizer

    folder = converted_folder(gguf)
    if (folder / _DONE).is_file():
        return (AutoConfig.from_pretrained(folder, local_files_only=True),
                AutoTokenizer.from_pretrained(folder, local_files_only=True))
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    _save(folder, config, tokenizer)
    return config, tokenizer


def _save(folder: Path, config: Any, tokenizer: Any) -> None:
    """Write the conversion beside its final name and rename it into place, so a reader never
    sees half of it and two processes converting at once both end with one whole copy."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
        try:
            config.save_pretrained(scratch)
            tokenizer.save_pretrained(scratch)
            (scratch / _DONE).touch()
            scratch.rename(folder)
        except OSError:
            if not (folder / _DONE).is_file():
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except OSError as exc:
        log.warning("GGUF conversion not cached in %s (%s); the next load converts again", folder.parent, exc)
