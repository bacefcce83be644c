"""LLMService: one served model — its engine (a thread, or the engine-core process), its metrics, and the names it answers to."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llm_engine.async_engine import AsyncLLMEngine, EngineNotReady, EngineOverloaded
from llm_engine.config import EngineConfig
from llm_engine.engine_core_client import EngineCoreClient
from llm_engine.engine_loop import ContextLengthExceeded
from llm_engine.entrypoints.kserve_metrics import TritonMetrics
from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.metrics import EngineMetrics

if TYPE_CHECKING:
    from llm_engine.entrypoints.ensemble import Ensemble


@dataclass
class ServerOptions:
    """How the server serves: queue bound, per-request timeout, optional API keys, and where the
    KServe v2 gRPC service listens (host:port; None: no gRPC), the /v2 ensembles, the CPUs the
    engine is pinned to (None: anywhere; the event loop and gRPC threads stay unpinned), and whether
    the engine steps in its own process (`llm serve`'s default) or in a thread of this one."""

    max_waiting: int = 64
    request_timeout: float | None = 600.0
    api_keys: frozenset[str] = field(default_factory=frozenset)
    grpc_address: str | None = None
    ensembles: tuple[Ensemble, ...] = ()  # served under /v2 next to the model
    engine_cpus: frozenset[int] | None = None
    engine_process: bool = False  # the engine core in its own process (EngineCoreClient), not a thread


class LLMService:
    def __init__(self, config: EngineConfig, served_name: str, options: ServerOptions | None = None) -> None:
        self.options = options or ServerOptions()
        self.served_name = served_name
        self.model_path = config.model
        self.metrics = EngineMetrics(served_name)
        self.triton_metrics = TritonMetrics([served_name, *(e.name for e in self.options.ensembles)])
        self.metrics.sections.append(self.triton_metrics.render)  # nv_inference_* on the same /metrics
        engine_class = EngineCoreClient if self.options.engine_process else AsyncLLMEngine
        self.engine: AsyncLLMEngine | EngineCoreClient = engine_class(
            config, self.options.max_waiting, on_step=self.metrics.on_step, cpus=self.options.engine_cpus)
        self.started_at = time.time()

    def max_model_len(self) -> int | None:
        return self.engine.max_model_len if self.engine.is_ready else None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """`loop`: the server's event loop, which then reads the engine core's outputs itself."""
        if isinstance(self.engine, EngineCoreClient):
            self.engine.start(loop)
        else:
            self.engine.start()

    def stop(self) -> None:
        self.engine.stop()

    def check_model(self, name: str) -> None:
        """404 for a model this server does not serve (its name and its path are accepted)."""
        if name not in (self.served_name, self.model_path):
            raise OpenAIError(404, f"The model `{name}` does not exist; this server serves "
                                   f"`{self.served_name}`", param="model", code="model_not_found")

    def require_ready(self) -> None:
        try:
            self.engine.require_engine()
        except EngineNotReady as exc:
            raise as_openai_error(exc) from None


def as_openai_error(exc: Exception) -> OpenAIError:
    """Map engine errors to OpenAI error answers (bad input 400, full 429, loading 503)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineOverloaded):
        return OpenAIError(429, str(exc), code="queue_full", retry_after=1)
    if isinstance(exc, EngineNotReady):
        return OpenAIError(503, str(exc), code="model_not_ready", retry_after=5)
    if isinstance(exc, ContextLengthExceeded):
        return OpenAIError(400, str(exc), param=exc.param, code="context_length_exceeded")
    if isinstance(exc, ValueError):
        message = str(exc)
        param = message.split(":", 1)[0] if ":" in message and " " not in message.split(":", 1)[0] else None
        return OpenAIError(400, message, param=param)
    return OpenAIError(500, f"{type(exc).__name__}: {exc}")
