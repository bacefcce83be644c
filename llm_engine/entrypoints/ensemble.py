"""Ensembles: models chained in config the way Triton's `ensemble_scheduling` chains them.

An ensemble is declared in Triton's model-config JSON (`platform: "ensemble"`, `input`, `output`,
`ensemble_scheduling.step[]` with `input_map` {step input: ensemble tensor} and `output_map`
{step output: ensemble tensor}) and served under /v2 (HTTP and gRPC) next to the model. A step
is the served LLM (`model_name: "llm"`, its tensors as in kserve.INPUTS/OUTPUTS) or one of the
small text steps below, e.g. the assistant's completion pipeline:

    code_context (prefix, context -> text_input) -> llm -> trim_to_line (text -> text)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from llm_engine.entrypoints import kserve
from llm_engine.entrypoints.kserve_metrics import RequestStats
from llm_engine.entrypoints.protocol import OpenAIError
from llm_engine.entrypoints.service import LLMService

LLM_STEP = "llm"
Tensors = dict[str, np.ndarray]


def _texts(array: np.ndarray) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def _bytes(texts: list[str]) -> np.ndarray:
    return np.array([t.encode() for t in texts], dtype=object).reshape(-1, 1)


def code_context(t: Tensors) -> Tensors:
    """Other files' text (optional `context`) above the file up to the cursor (`prefix`): the
    assistant's plain-text completion prompt."""
    prefixes = _texts(t["prefix"])
    contexts = _texts(t["context"]) if "context" in t else [""] * len(prefixes)
    if len(contexts) == 1 < len(prefixes):
        contexts *= len(prefixes)
    return {"text_input": _bytes([f"{c.rstrip()}\n\n{p}" if c.strip() else p for c, p in zip(contexts, prefixes)])}


def trim_to_line(t: Tensors) -> Tensors:
    """Keep a completion to the end of the cursor's line, as ghost text shows it."""
    return {"text": _bytes([text.split("\n", 1)[0] for text in _texts(t["text"])])}


STEPS: dict[str, Callable[[Tensors], Tensors]] = {"code_context": code_context, "trim_to_line": trim_to_line}


class Ensemble:
    def __init__(self, config: dict[str, Any]) -> None:
        """Check the config's shape and every step's model and tensors; ValueError names the problem."""
        try:
            self.name = config["name"]
            self.inputs, self.outputs = config["input"], config["output"]
            self.steps = config["ensemble_scheduling"]["step"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"ensemble: missing {exc} (a Triton ensemble config: name, input, output, "
                             f"ensemble_scheduling.step)") from None
        known = {t["name"] for t in self.inputs}
        for step in self.steps:
            model = step.get("model_name")
            if model != LLM_STEP and model not in STEPS:
                raise ValueError(f"ensemble {self.name}: unknown step model {model!r} "
                                 f"(use {LLM_STEP!r} or one of {', '.join(STEPS)})")
            unknown = set(step.get("input_map", {}).values()) - known
            if unknown:
                raise ValueError(f"ensemble {self.name}: step {model} reads {sorted(unknown)} before any step makes them")
            known |= set(step.get("output_map", {}).values())
        missing = {t["name"] for t in self.outputs} - known
        if missing:
            raise ValueError(f"ensemble {self.name}: no step makes the outputs {sorted(missing)}")
        self.config = {**config, "platform": "ensemble"}

    @classmethod
    def load(cls, path: str | Path) -> Ensemble:
        try:
            return cls(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"ensemble: {path}: {exc}") from None

    def metadata(self) -> dict[str, Any]:
        def tensor(t: dict[str, Any]) -> dict[str, Any]:
            return {"name": t["name"], "datatype": _DATATYPES[t["data_type"]], "shape": [-1, *t.get("dims", [1])]}
        return {"name": self.name, "versions": [kserve.VERSION], "platform": "ensemble",
                "inputs": [tensor(t) for t in self.inputs], "outputs": [tensor(t) for t in self.outputs]}

    async def infer(self, service: LLMService, tensors: Tensors, parameters: dict[str, Any] | None = None,
                    stats: RequestStats | None = None) -> Tensors:
        """Run the steps in order over a pool of named tensors; the LLM step is one batched request."""
        allowed = {t["name"] for t in self.inputs}
        for name in tensors:
            if name not in allowed:
                raise OpenAIError(400, f"unexpected inference input '{name}' (inputs: {', '.join(sorted(allowed))})")
        pool = dict(tensors)
        for step in self.steps:
            args = {inner: pool[outer] for inner, outer in step.get("input_map", {}).items() if outer in pool}
            if step["model_name"] == LLM_STEP:
                serving = kserve.ServingV2(service, stats)
                requests = kserve.requests_from_tensors(service, args, parameters)
                results = kserve.output_arrays(await serving.complete(await serving.start_rows(requests)))
            else:
                try:
                    results = STEPS[step["model_name"]](args)
                except KeyError as exc:
                    raise OpenAIError(400, f"step {step['model_name']} needs input {exc}") from None
            for inner, outer in step.get("output_map", {}).items():
                pool[outer] = results[inner]
        return {t["name"]: pool[t["name"]] for t in self.outputs}


_DATATYPES = {v: k for k, v in kserve.CONFIG_TYPES.items()}
