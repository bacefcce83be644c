"""Engines for the benchmarks that time the IDE assistant's own path (LocalModel over an LLMService)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_engine import EngineConfig


def start_loaded(configs: dict[str, EngineConfig]) -> dict[str, Any]:
    """One started LLMService per row, each loaded before the next starts (two loads at once raced on
    Transformers' lazy imports); exits naming the row whose model failed to load."""
    from llm_engine.entrypoints import LLMService

    services = {}
    for row, config in configs.items():
        service = LLMService(config, row)
        service.start()
        services[row] = service
        while not service.engine.is_ready:
            if service.engine.load_error is not None:
                raise SystemExit(f"{row}: the model failed to load: {service.engine.load_error}")
            time.sleep(0.2)
    return services
