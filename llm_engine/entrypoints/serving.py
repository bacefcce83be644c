"""Completions and chat completions over the LLMService: prompts in, OpenAI JSON or SSE chunks out.

Both endpoints turn a request into prompts and SamplingParams, run the prompts concurrently, and
format the cumulative engine outputs as per-choice deltas. Bad input fails before any byte is
streamed: every prompt's first output (or refusal) is awaited first, except a stream's one prompt
that the engine cannot refuse any more once it is sent (`_Serving.start`): its headers go out
while the engine prefills it. A completion's prompts go to
the engine as sent, and the engine tokenizes them and checks the context window
(`AddRequest.fit_window`), off this process's CPU; a chat's conversation is rendered and tokenized
here (its template and images need the tokenizer). Usage counts the prompt tokens the engine
reports. Leaving a stream early cancels the prompt tasks, whose generators abort their requests in
the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_engine.async_engine import AsyncLLMEngine, EngineNotReady
from llm_engine.beam_search import BeamSearchParams
from llm_engine.engine_core_client import EngineCoreClient
from llm_engine.engine_loop import check_window
from llm_engine.entrypoints.chat_images import request_images, with_placeholders
from llm_engine.entrypoints.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from llm_engine.entrypoints.request_ids import new_request_id
from llm_engine.entrypoints.service import LLMService, as_openai_error
from llm_engine.outputs import CompletionOutput, Logprob, RequestOutput
from llm_engine.request_streams import RequestOutputs
from llm_engine.sampling_params import SamplingParams
from llm_engine.tokenizer import token_count_bound

if TYPE_CHECKING:  # torch and Pillow load only when an image comes (the IDE imports this without them)
    from llm_engine.multimodal.inputs import ImageInputs, ImagePrompt
    from llm_engine.tokenizer import Tokenizer

@dataclass
class _Choice:
    """How much of one choice the client has already been sent."""

    index: int
    text_sent: int = 0
    tokens_sent: int = 0
    finish_reason: str | None = None
    done: bool = False


@dataclass
class _Run:
    """A request in flight: its prompts and the merged stream of (prompt index, output)."""

    prompt_ids: list[list[int]]
    n: int
    updates: AsyncGenerator[tuple[int, RequestOutput], None]
    choices: list[_Choice] = field(default_factory=list)
    completion_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompt_ids)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def sse(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


ChunkFn = Callable[..., bytes]  # chunk(choices, usage=None) -> one SSE event


class _Serving:
    """Shared request plumbing for both endpoints."""

    def __init__(self, service: LLMService) -> None:
        self.service = service

    @property
    def engine(self) -> AsyncLLMEngine | EngineCoreClient:
        return self.service.engine

    def tokenizer(self) -> Tokenizer:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise OpenAIError(400, f"model {self.service.served_name!r} has no tokenizer; it cannot write text")
        return tokenizer

    def sampling_params(self, req: CompletionRequest | ChatCompletionRequest, max_tokens: int | None,
                        logprobs: int | None) -> SamplingParams:
        try:
            return SamplingParams(
                n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty, seed=req.seed, stop=req.stop, max_tokens=max_tokens,
                min_tokens=req.min_tokens, logprobs=logprobs, ignore_eos=req.ignore_eos,
                timeout=self.service.options.request_timeout, structured_outputs=req.structured_outputs_params(),
                kv_transfer_params=req.kv_transfer_params)
        except ValueError as exc:
            raise as_openai_error(exc) from None

    def check_length(self, prompt_ids: list[int], max_tokens: int | None) -> int:
        """The max_tokens to use for token ids tokenized here: checked against the context window
        as the engine checks the prompts it tokenizes (None: fill the window)."""
        limit = self.engine.max_model_len
        try:
            check_window(limit, len(prompt_ids), max_tokens)
        except ValueError as exc:
            raise as_openai_error(exc) from None
        return max_tokens if max_tokens is not None else limit - len(prompt_ids)

    async def start(self, prompts: Sequence[str | list[int] | ImagePrompt],
                    params: Sequence[SamplingParams | BeamSearchParams],
                    priority: int, request_id: str, fit_window: bool = False, stream: bool = False) -> _Run:
        """Admit every prompt (raising 429/503/400 before any answer is sent), then merge their outputs.
        `fit_window`: the prompts are as the client sent them, for the engine to tokenize and check.
        `stream`: a stream's headers may go before its first token: one prompt that nothing in the
        engine can refuse any more (`_sure_to_start`) returns once it is sent, and a failure after
        that reaches the client as the stream's error event; otherwise the first outputs are awaited,
        so that what the engine refuses is still a status code."""
        outputs: list[RequestOutputs] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                outputs.append(self.engine.open(prompt, p, f"{request_id}-{i}", priority=priority,
                                                more=i < len(prompts) - 1, fit_window=fit_window))
            if len(outputs) == 1:  # most requests: no task to wrap it in (gather's), one hop less
                started = stream and self._sure_to_start(prompts[0], params[0], fit_window)
                first = None if started else await anext(outputs[0])
            else:
                # every prompt at once: awaiting each one's first output before sending the next put
                # a batch's prompts into the engine a step apart
                results = await asyncio.gather(*(anext(out) for out in outputs), return_exceptions=True)
                failure = next((r for r in results if isinstance(r, BaseException)), None)
                if failure is not None:
                    raise failure
                firsts = [r for r in results if isinstance(r, RequestOutput)]
        except BaseException as exc:
            for out in outputs:
                await out.aclose()
            if isinstance(exc, Exception):
                raise as_openai_error(exc) from None
            raise
        head = params[0]  # a beam search's output holds its beam_width best beams
        n = head.n if isinstance(head, SamplingParams) else head.beam_width
        if len(outputs) == 1:
            prompt_ids = [[] if first is None else first.prompt_token_ids]
            run = _Run(prompt_ids, n, _single(outputs[0], first, prompt_ids))
        else:
            run = _Run([first.prompt_token_ids for first in firsts], n, _merge(outputs, firsts))
        run.choices = [_Choice(i) for i in range(len(prompts) * run.n)]
        return run

    def _sure_to_start(self, prompt: str | list[int] | ImagePrompt, params: SamplingParams | BeamSearchParams,
                       fit_window: bool) -> bool:
        """Whether the engine takes this prompt for sure, now that it is sent (`LLMEngine.add_request`'s
        and `engine_loop._fitted`'s checks): plain sampling of a text or token ids (no grammar to
        compile, no KV transfer, no images, no beams), and a text the engine tokenizes
        (`fit_window`) non-empty and, by a bound on its token count, inside the context window."""
        tokenizer = self.engine.tokenizer
        if not isinstance(params, SamplingParams) or params.structured_outputs is not None \
                or params.kv_transfer_params is not None or not prompt or (params.stop_list and tokenizer is None):
            return False
        if not fit_window:
            return isinstance(prompt, list)  # token ids tokenized and checked against the window here
        if not isinstance(prompt, str):
            return False  # token ids as the client sent them: the engine checks their vocabulary
        bound = None if tokenizer is None else token_count_bound(tokenizer, prompt)
        room = self.engine.max_model_len - (params.max_tokens or 1)
        return bound is not None and bound <= room

    def image_inputs(self) -> ImageInputs:
        inputs = self.engine.image_inputs
        if inputs is None:
            raise OpenAIError(400, f"model {self.service.served_name!r} is a text-only model; it cannot see images")
        return inputs

    async def with_images(self, ids: list[int], images: list[bytes]) -> tuple[list[int], list[int] | ImagePrompt]:
        """(prompt ids, what the engine gets): with images, each image token is expanded to the
        image's placeholders, and the files are decoded and preprocessed in a worker thread (not
        on the event loop, not on the engine's thread)."""
        if not images:
            return ids, ids
        inputs = self.image_inputs()
        try:
            expanded, items = await asyncio.to_thread(inputs, ids, images)
        except ValueError as exc:
            raise as_openai_error(exc) from None
        from llm_engine.multimodal.inputs import ImagePrompt  # torch: only once images come

        return expanded, ImagePrompt(expanded, items)

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        try:
            return self.engine.tokenize(prompt)
        except (ValueError, EngineNotReady) as exc:
            raise as_openai_error(exc) from None

    def token_text(self, token_id: int) -> str:
        return self.tokenizer().decode([token_id])

    def new_part(self, run: _Run, prompt_index: int, out: CompletionOutput) -> tuple[_Choice, str, slice] | None:
        """The choice, its new text and the slice of its new tokens since the last call, or None
        when there is nothing new to send (no text, no tokens, not just finished)."""
        choice = run.choices[prompt_index * run.n + out.index]
        if choice.done or (len(out.text) == choice.text_sent and len(out.token_ids) == choice.tokens_sent
                           and out.finish_reason is None):
            return None
        text = out.text[choice.text_sent:]
        tokens = slice(choice.tokens_sent, len(out.token_ids))
        run.completion_tokens += len(out.token_ids) - choice.tokens_sent
        choice.text_sent, choice.tokens_sent = len(out.text), len(out.token_ids)
        if out.finish_reason is not None:
            choice.finish_reason = _finish_reason(out)
            choice.done = True
        return choice, text, tokens

    async def _sse(self, req: CompletionRequest | ChatCompletionRequest, run: _Run, request_id: str, object_name: str,
                   events: Callable[[ChunkFn], AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
        """The stream framing both APIs share: their chunks, usage when asked, errors in-stream, then [DONE]."""
        created = self.created()

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            body: dict[str, Any] = {"id": request_id, "object": object_name, "created": created, "model": req.model,
                    "choices": choices}
            if usage is not None:
                body["usage"] = usage
            return sse(body)

        try:
            async for event in events(chunk):
                yield event
            if req.stream_options and req.stream_options.include_usage:
                yield chunk([], run.usage())
        except OpenAIError as exc:
            yield sse(exc.body())
        finally:
            await run.updates.aclose()
        yield sse("[DONE]")

    def created(self) -> int:
        return int(time.time())


async def _single(outputs: RequestOutputs, first: RequestOutput | None, prompt_ids: list[list[int]]
                  ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """One prompt's stream (most requests): its outputs straight through, without the task and
    queue hop per output that interleaving several streams needs; closing it aborts the request.
    `first`: its first output, or None when the stream started before it (`start`'s `stream`):
    then its prompt's token ids go into `prompt_ids` (the run's) once it comes."""
    try:
        if first is None:
            first = await anext(outputs)
            prompt_ids[0] = first.prompt_token_ids
        yield 0, first
        if not first.finished:
            async for out in outputs:
                yield 0, out
    except Exception as exc:
        raise as_openai_error(exc) from None
    finally:
        await outputs.aclose()


async def _merge(generators: list[RequestOutputs], firsts: list[RequestOutput]
                 ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """Interleave several request streams; closing this closes (and so aborts) all of them."""
    merged: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()

    async def pump(index: int, gen: RequestOutputs) -> None:
        try:
            async for out in gen:
                await merged.put((index, out))
        except Exception as exc:
            await merged.put((index, exc))
        finally:
            await merged.put((index, None))

    for index, first in enumerate(firsts):
        await merged.put((index, first))
    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(generators)
             if not firsts[i].finished]
    open_streams = len(tasks)
    try:
        while open_streams or not merged.empty():
            index, item = await merged.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, Exception):
                raise as_openai_error(item)
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for gen in generators:
            await gen.aclose()


def _finish_reason(out: CompletionOutput) -> str:
    return out.finish_reason if out.finish_reason in ("stop", "length") else "length"


def _check_output(output: RequestOutput) -> None:
    if output.error:
        status = 500 if any(o.finish_reason == "error" for o in output.outputs) else 400
        raise OpenAIError(status, output.error)


def _kv_transfer(output: RequestOutput) -> dict[str, Any]:
    """A prefill instance's answer names the KV it keeps for the decode instance (vLLM's field)."""
    return {"kv_transfer_params": output.kv_transfer_params} if output.kv_transfer_params else {}


def _top(logprobs: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    return sorted(((t, lp) for t, lp in logprobs.items() if lp.rank <= k), key=lambda item: item[1].rank)


class ServingCompletion(_Serving):
    async def create(self, req: CompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        self.service.check_model(req.model)
        self.service.require_ready()
        if req.suffix is not None:
            raise OpenAIError(400, "suffix is not supported", param="suffix")
        if req.echo and req.logprobs is not None:
            raise OpenAIError(400, "echo with logprobs is not supported (no prompt logprobs)", param="echo")
        prompts = req.prompts()
        if req.kv_transfer_params is not None and len(prompts) > 1:
            raise OpenAIError(400, "kv_transfer_params: one prompt per request", param="kv_transfer_params")
        request_id = new_request_id("cmpl")
        if req.use_beam_search:
            return await self._beam_search(req, [self.tokenize(p) for p in prompts], request_id)
        params = [self.sampling_params(req, req.max_tokens, req.logprobs) for _ in prompts]
        run = await self.start(prompts, params, req.priority, request_id, fit_window=True, stream=bool(req.stream))
        if req.stream:
            return self._stream(req, run, request_id)
        return await self._full(req, run, request_id)

    async def _beam_search(self, req: CompletionRequest, prompt_ids: list[list[int]], request_id: str
                           ) -> dict[str, Any]:
        """One beam group per prompt inside the engine (BeamSearchParams: its beams fork each other's
        KV blocks, see llm_engine.beam_steps); the n best beams of each prompt are its choices."""
        try:
            constrained = req.structured_outputs_params() is not None
        except ValueError as exc:
            raise as_openai_error(exc) from None
        for name, unsupported in (("stream", req.stream), ("echo", req.echo), ("logprobs", req.logprobs is not None),
                                  ("stop", bool(req.stop)), ("structured_outputs", constrained),
                                  ("kv_transfer_params", req.kv_transfer_params is not None)):
            if unsupported:
                raise OpenAIError(400, f"{name} is not supported with use_beam_search", param=name)
        width = req.best_of or req.n
        if width < req.n:
            raise OpenAIError(400, f"best_of ({width}) must be at least n ({req.n})", param="best_of")
        params: list[SamplingParams | BeamSearchParams] = [
            BeamSearchParams(beam_width=width, max_tokens=self.check_length(ids, req.max_tokens),
                             ignore_eos=req.ignore_eos, length_penalty=req.length_penalty) for ids in prompt_ids]
        run = await self.start(prompt_ids, params, req.priority, request_id)
        finals: dict[int, RequestOutput] = {}
        try:
            async for index, output in run.updates:
                _check_output(output)
                if output.finished:
                    finals[index] = output
        finally:
            await run.updates.aclose()
        choices: list[dict[str, Any]] = []
        for index in range(len(prompt_ids)):
            for k, beam in enumerate(finals[index].outputs[:req.n]):  # best first
                run.completion_tokens += len(beam.token_ids)
                choices.append({"index": index * req.n + k, "text": beam.text, "logprobs": None,
                                "finish_reason": _finish_reason(beam)})
        return {"id": request_id, "object": "text_completion", "created": self.created(), "model": req.model,
                "choices": choices, "usage": run.usage()}

    def _echo(self, req: CompletionRequest, run: _Run, prompt_index: int) -> str:
        prompt = req.prompts()[prompt_index]
        return prompt if isinstance(prompt, str) else self.tokenizer().decode(run.prompt_ids[prompt_index])

    def _logprobs(self, out: CompletionOutput, tokens: slice, k: int, offset: int) -> dict[str, list[Any]]:
        result: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, top in zip(out.token_ids[tokens], (out.logprobs or [])[tokens]):
            text = self.token_text(token_id)
            result["tokens"].append(text)
            result["token_logprobs"].append(top[token_id].logprob)
            result["top_logprobs"].append({self.token_text(t): lp.logprob
                                           for t, lp in [(token_id, top[token_id])] + _top(top, k)})
            result["text_offset"].append(offset)
            offset += len(text)
        return result

    async def _full(self, req: CompletionRequest, run: _Run, request_id: str) -> dict[str, Any]:
        finals: dict[int, RequestOutput] = {}
        async for index, output in run.updates:
            _check_output(output)
            for out in output.outputs:
                self.new_part(run, index, out)
            if output.finished:
                finals[index] = output
        choices: list[dict[str, Any]] = []
        for index in range(len(run.prompt_ids)):
            for out in finals[index].outputs:
                choice = run.choices[index * run.n + out.index]
                prefix = self._echo(req, run, index) if req.echo else ""
                logprobs = (self._logprobs(out, slice(0, None), req.logprobs, len(prefix))
                            if req.logprobs is not None else None)
                choices.append({"index": choice.index, "text": prefix + out.text, "logprobs": logprobs,
                                "finish_reason": choice.finish_reason})
        return {"id": request_id, "object": "text_completion", "created": self.created(), "model": req.model,
                "choices": choices, "usage": run.usage(), **_kv_transfer(finals[0])}

    def _stream(self, req: CompletionRequest, run: _Run, request_id: str) -> AsyncIterator[bytes]:
        async def events(chunk: ChunkFn) -> AsyncIterator[bytes]:
            if req.echo:
                for index in range(len(run.prompt_ids)):
                    for c in run.choices[index * run.n:(index + 1) * run.n]:
                        yield chunk([{"index": c.index, "text": self._echo(req, run, index), "logprobs": None,
                                      "finish_reason": None}])
            async for index, output in run.updates:
                _check_output(output)
                for out in output.outputs:
                    offset = run.choices[index * run.n + out.index].text_sent
                    part = self.new_part(run, index, out)
                    if part is None:
                        continue
                    choice, text, tokens = part
                    logprobs = (self._logprobs(out, tokens, req.logprobs, offset)
                                if req.logprobs is not None else None)
                    yield chunk([{"index": choice.index, "text": text, "logprobs": logprobs,
                                  "finish_reason": choice.finish_reason}])
        return self._sse(req, run, request_id, "text_completion", events)


class ServingChat(_Serving):
    async def create(self, req: ChatCompletionRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        self.service.check_model(req.model)
        self.service.require_ready()
        prompt_ids, prompt = await self._prompt(req)
        max_tokens = self.check_length(prompt_ids, req.max_completion_tokens or req.max_tokens)
        top = req.top_logprobs or 0
        params = [self.sampling_params(req, max_tokens, top if req.logprobs else None)]
        request_id = new_request_id("chatcmpl")
        run = await self.start([prompt], params, req.priority, request_id, stream=bool(req.stream))
        if req.stream:
            return self._stream(req, run, request_id)
        return await self._full(req, run, request_id)

    async def _prompt(self, req: ChatCompletionRequest) -> tuple[list[int], list[int] | ImagePrompt]:
        """(prompt token ids, what the engine gets); each image is the model's placeholder token."""
        images = request_images(req)
        if not images:
            return await self.with_images(self.tokenize(self._render(req, "")), [])
        placeholder = self.tokenizer().convert_ids_to_tokens(self.image_inputs().image_token_id)
        return await self.with_images(self.tokenize(self._render(req, placeholder)), images)

    def _render(self, req: ChatCompletionRequest, image_placeholder: str) -> list[int]:
        """Token ids of the conversation through the tokenizer's chat template."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise OpenAIError(400, "this model has no chat template; use /v1/completions", param="messages")
        messages = with_placeholders(req, image_placeholder)
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # templates raise their own errors on unsupported conversations
            raise OpenAIError(400, f"messages: the chat template rejected them: {exc}", param="messages") from None
        ids: list[int] = tokenizer(text, add_special_tokens=False).input_ids
        return ids

    def _logprobs(self, out: CompletionOutput, tokens: slice, k: int) -> dict[str, Any]:
        content = []
        for token_id, top in zip(out.token_ids[tokens], (out.logprobs or [])[tokens]):
            text = self.token_text(token_id)
            content.append({"token": text, "logprob": top[token_id].logprob, "bytes": list(text.encode()),
                            "top_logprobs": [{"token": (t_text := self.token_text(t)), "logprob": lp.logprob,
                                              "bytes": list(t_text.encode())} for t, lp in _top(top, k)]})
        return {"content": content}

    async def _full(self, req: ChatCompletionRequest, run: _Run, request_id: str) -> dict[str, Any]:
        final: RequestOutput | None = None
        async for _, output in run.updates:
            _check_output(output)
            for out in output.outputs:
                self.new_part(run, 0, out)
            final = output
        assert final is not None and final.finished
        choices = [{"index": out.index, "message": {"role": "assistant", "content": out.text},
                    "logprobs": self._logprobs(out, slice(0, None), req.top_logprobs or 0) if req.logprobs else None,
                    "finish_reason": run.choices[out.index].finish_reason} for out in final.outputs]
        return {"id": request_id, "object": "chat.completion", "created": self.created(), "model": req.model,
                "choices": choices, "usage": run.usage(), **_kv_transfer(final)}

    def _stream(self, req: ChatCompletionRequest, run: _Run, request_id: str) -> AsyncIterator[bytes]:
        async def events(chunk: ChunkFn) -> AsyncIterator[bytes]:
            for c in run.choices:
                yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}])
            async for _, output in run.updates:
                _check_output(output)
                for out in output.outputs:
                    part = self.new_part(run, 0, out)
                    if part is None:
                        continue
                    choice, text, tokens = part
                    logprobs = self._logprobs(out, tokens, req.top_logprobs or 0) if req.logprobs else None
                    yield chunk([{"index": choice.index, "delta": {"content": text} if text else {},
                                  "logprobs": logprobs, "finish_reason": choice.finish_reason}])
        return self._sse(req, run, request_id, "chat.completion.chunk", events)
