"""The engine's on-disk cache folder, shared by the GGUF conversion cache and kernel autotuning."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`CODEYARD_CACHE_DIR`, else `$XDG_CACHE_HOME/codeyard`, else `~/.cache/codeyard`."""
    if explicit := os.environ.get("CODEYARD_CACHE_DIR"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "codeyard"
