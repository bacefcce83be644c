"""The engine's servers: the OpenAI-compatible /v1 and KServe v2 /v2 routers over one LLMService,
and the standalone app (`create_app`). Other packages (the IDE's assistant) import these names from
here, never the route modules; they load on first use, so `protocol` alone stays light."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_engine.entrypoints.api import answer
    from llm_engine.entrypoints.api import build_router as build_openai_router
    from llm_engine.entrypoints.api import install as install_error_handler
    from llm_engine.entrypoints.app import create_app
    from llm_engine.entrypoints.disconnects import unless_disconnected
    from llm_engine.entrypoints.kserve_grpc import start_server as start_grpc_server
    from llm_engine.entrypoints.kserve_http import build_router as build_kserve_router
    from llm_engine.entrypoints.models import resolve_model
    from llm_engine.entrypoints.protocol import ChatCompletionRequest, OpenAIError
    from llm_engine.entrypoints.service import LLMService, as_openai_error
    from llm_engine.entrypoints.serving import ServingChat

_EXPORTS = {
    "answer": ("api", "answer"), "unless_disconnected": ("disconnects", "unless_disconnected"),
    "build_openai_router": ("api", "build_router"), "install_error_handler": ("api", "install"),
    "create_app": ("app", "create_app"), "build_kserve_router": ("kserve_http", "build_router"),
    "start_grpc_server": ("kserve_grpc", "start_server"),
    "resolve_model": ("models", "resolve_model"), "ChatCompletionRequest": ("protocol", "ChatCompletionRequest"),
    "OpenAIError": ("protocol", "OpenAIError"), "LLMService": ("service", "LLMService"),
    "as_openai_error": ("service", "as_openai_error"), "ServingChat": ("serving", "ServingChat"),
}
__all__ = ["answer", "unless_disconnected", "build_openai_router", "install_error_handler", "create_app",
           "build_kserve_router", "start_grpc_server", "resolve_model", "ChatCompletionRequest", "OpenAIError", "LLMService", "as_openai_error",
           "ServingChat"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llm_engine.entrypoints' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(import_module(f"llm_engine.entrypoints.{module}"), attr)
