"""LLMEngine: add requests, run steps, abort; the loop an async server drives."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from llm_engine.beam_search import BeamGroup, BeamSearchParams
from llm_engine.beam_steps import BeamSteps, beam_completions
from llm_engine.block_manager import BlockManager
from llm_engine.config import EngineConfig
from llm_engine.detokenizer import IncrementalDetokenizer, find_stop_string
from llm_engine.draft_model import DraftModelProposer
from llm_engine.executor import MultiprocExecutor, WorkerGroupError, WorkerGroupExecutor
from llm_engine.kv_connector import KVConnector, KVShard, KVTransferConfig
from llm_engine.loader import ModelSource
from llm_engine.model_runner import ModelRunner
from llm_engine.models.registry import resolve_model_class
from llm_engine.multimodal.image import ImageInputError
from llm_engine.multimodal.inputs import ImageInputs, ImageItem, ImagePrompt
from llm_engine.outputs import CompletionOutput, RequestOutput
from llm_engine.sampler import SampleResult
from llm_engine.sampling_params import SamplingParams
from llm_engine.scheduler import Scheduler, SchedulerOutput
from llm_engine.sequence import Request, Sequence, SequenceStatus
from llm_engine.speculative import SpecThrottle, VerifyCost, find_ngram
from llm_engine.structured_outputs import Grammar, GrammarCompiler
from llm_engine.tokenizer import tokenize_prompt

logger = logging.getLogger(__name__)

KV_LOAD_POLL_S = 0.005  # a step with only KV loads to wait for waits this long at most, then takes new requests


@dataclass
class EngineStats:
    """Counters and gauges for monitoring (totals since start)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    last_iteration_tokens: int
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    mm_cache_queries: int = 0  # images looked up in the encoder-output cache
    mm_cache_hits: int = 0  # of which found there (the vision tower skipped)
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    @property
    def spec_decode_mean_acceptance_length(self) -> float | None:
        """Tokens emitted per verified draft (accepted ones plus the target's own), as vLLM logs it."""
        if not self.spec_decode_num_drafts:
            return None
        return 1 + self.spec_decode_num_accepted_tokens / self.spec_decode_num_drafts


@dataclass
class SpecDecodeCounters:
    """Totals of speculative verification since start."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, proposed: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += proposed
        self.num_accepted_tokens += accepted
        self.accepted_per_pos.extend([0] * (proposed - len(self.accepted_per_pos)))
        for pos in range(accepted):
            self.accepted_per_pos[pos] += 1


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        source = ModelSource(config.model, config.tokenizer)
        self.hf_config = source.hf_config()
        self.tokenizer = source.tokenizer()
        model_class = resolve_model_class(getattr(self.hf_config, "architectures", None), config.model_impl)
        self.image_inputs = (ImageInputs(self.hf_config, model_class, source.folder)
                             if hasattr(model_class, "image_inputs") else None)
        if self.image_inputs is not None and config.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size: vision models run on one rank so far")
        text_config = self.hf_config.get_text_config()  # a vision model's language part
        if self.image_inputs is not None and config.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size: vision models run on one rank so far")
        self.model_runner = self._start_model_runner(source)
        num_blocks = self.model_runner.num_blocks
        self.max_model_len = min(config.max_model_len or text_config.max_position_embeddings,
                                 text_config.max_position_embeddings, num_blocks * config.block_size)
        window = getattr(text_config, "sliding_window", None)
        if window and getattr(text_config, "use_sliding_window", True) and not getattr(model_class, "sliding_window", False):
            # The reference attention is full attention: stay where the two agree.
            self.max_model_len = min(self.max_model_len, window)
        self.vocab_size = text_config.vocab_size
        self.eos_token_ids = self._eos_token_ids()
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.beam_steps = BeamSteps(self.block_manager, self.scheduler)
        self.requests: dict[str, Request] = {}
        self._updated: set[str] = set()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.last_iteration_tokens = 0
        self.finished_by_reason: dict[str, int] = {}
        self.speculative = config.speculative_config
        self.spec_counters = SpecDecodeCounters()
        # the step's forward on this thread: its CPU time; GPUs and worker ranks: wall time
        on_this_thread = config.device == "cpu" and config.tensor_parallel_size == 1
        self.verify_cost = VerifyCost(clock=time.thread_time if on_this_thread else time.perf_counter)
        self.drafter = (DraftModelProposer(config, self.speculative.model, num_blocks, self.vocab_size)
                        if self.speculative is not None and self.speculative.model else None)
        self._grammar_compiler: GrammarCompiler | None = None  # built by the first constrained request
        self.kv_connector = self._make_kv_connector()
        self._kv_loads: dict[int, tuple[Sequence, list[int]]] = {}  # seq_id -> (seq, its held blocks)

    def _make_kv_connector(self) -> KVConnector | None:
        """Disaggregated serving's side of this engine (config checked: CPU, local ranks)."""
        config = self.config.kv_transfer_config
        if not isinstance(config, KVTransferConfig):
            return None
        return KVConnector(config, self._kv_shards())

    def _kv_shards(self) -> list[KVShard]:
        """The KV pool as the connector sees it: this process's, or each local rank's file mapped here."""
        runner = self.model_runner
        if isinstance(runner, ModelRunner):
            return [KVShard(runner.kv_cache, 0, runner.kv_pool_path)]
        return [shard.open() for shard in runner.kv_shards]

    @classmethod
    def from_kwargs(cls, **kwargs) -> LLMEngine:
        return cls(EngineConfig(**kwargs))

    def _eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        configured = getattr(self.hf_config.get_text_config(), "eos_token_id", None)
        if configured is not None:
            ids.update(configured if isinstance(configured, list) else [configured])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ----- requests -------------------------------------------------------------------------

    def tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        return tokenize_prompt(self.tokenizer, self.vocab_size, prompt)

    def _prompt_inputs(self, prompt: str | list[int] | dict | ImagePrompt
                       ) -> tuple[str | None, list[int], list[ImageItem]]:
        """A text or token-id prompt, or vLLM's dict: {"prompt" or "prompt_token_ids",
        "multi_modal_data": {"image": a picture or a list}} (PIL images or file bytes), or an
        ImagePrompt a server prepared."""
        if isinstance(prompt, ImagePrompt):
            return None, prompt.token_ids, prompt.items
        images: list = []
        if isinstance(prompt, dict):
            unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids", "multi_modal_data"})
            if unknown:
                raise ValueError(f"prompt: unknown keys {unknown}")
            if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
                raise ValueError("prompt: give exactly one of 'prompt' and 'prompt_token_ids'")
            data = prompt.get("multi_modal_data") or {}
            if not isinstance(data, dict) or set(data) - {"image"}:
                raise ValueError("multi_modal_data: only {'image': [...]} is supported")
            images = data.get("image") or []
            images = images if isinstance(images, list) else [images]
            prompt = prompt["prompt"] if "prompt" in prompt else prompt["prompt_token_ids"]
        text, token_ids = self.tokenize(prompt)
        if self.image_inputs is not None:  # also checks that every placeholder has its image
            token_ids, items = self.image_inputs(token_ids, images)
            return text, token_ids, items
        if images:
            raise ImageInputError(f"model: {self.config.model} is a text-only model; it cannot see images")
        return text, token_ids, []

    def add_request(self, request_id: str, prompt: str | list[int] | dict | ImagePrompt,
                    params: SamplingParams | BeamSearchParams | None = None, priority: int = 0,
                    arrival_time: float | None = None) -> None:
        """A request to sample (SamplingParams) or a beam search (BeamSearchParams: its output's
        completions are the beam_width best beams, best first, with their cumulative logprobs)."""
        beam = None
        if isinstance(params, BeamSearchParams):
            beam = BeamGroup(params, self.eos_token_ids)
            params = SamplingParams(temperature=0, max_tokens=params.max_tokens, ignore_eos=True)
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority: must be an integer, got {priority!r}")
        if params.stop_list and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer; use stop_token_ids")
        text, token_ids, images = self._prompt_inputs(prompt)
        if not token_ids:
            raise ValueError("prompt: must not be empty")
        grammar = self._compile_grammar(params)
        self._check_kv_transfer(params, token_ids)
        if beam is not None:
            self._check_beam_fits(beam, len(token_ids))
        request = Request(request_id, text, token_ids, params, priority, arrival_time,
                          use_priority=self.config.scheduling_policy == "priority", images=images,
                          grammar=grammar, beam=beam)
        self.requests[request_id] = request
        self._updated.add(request_id)
        if len(token_ids) >= self.max_model_len:
            request.error = (f"prompt is {len(token_ids)} tokens; this engine allows at most "
                             f"{self.max_model_len - 1} prompt tokens (max_model_len {self.max_model_len})")
            self._finish(request.seqs[0], SequenceStatus.FINISHED_IGNORED)
            return
        self.scheduler.add(request.seqs[0])

    def _compile_grammar(self, params: SamplingParams) -> Grammar | None:
        if params.structured_outputs is None:
            return None
        if self.tokenizer is None:
            raise ValueError("structured_outputs: this model has no tokenizer to build token masks from")
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._grammar_compiler.compile(params.structured_outputs)

    def _check_beam_fits(self, beam: BeamGroup, num_prompt_tokens: int) -> None:
        """A beam group runs whole: its beams must fit in the pool and the batch without sharing."""
        width = beam.params.beam_width
        length = min(num_prompt_tokens + beam.params.max_tokens, self.max_model_len)
        needed = width * self.block_manager.blocks_needed(length)
        if width > self.config.max_num_seqs:
            raise ValueError(f"beam_width: {width} beams do not fit max_num_seqs {self.config.max_num_seqs}")
        if needed > self.block_manager.num_blocks:
            raise ValueError(f"beam_width: {width} beams of {length} tokens need {needed} KV blocks; "
                             f"this engine has {self.block_manager.num_blocks}")

    def _check_kv_transfer(self, params: SamplingParams, token_ids: list[int]) -> None:
        if params.kv_transfer_params is None:
            return
        if self.kv_connector is None:
            raise ValueError("kv_transfer_params: this engine is not a prefill or decode instance "
                             "(it has no kv_transfer_config)")
        self.kv_connector.check_params(params.kv_transfer_params, token_ids)
        if self.kv_connector.config.is_producer and params.n != 1:
            raise ValueError("kv_transfer_params: a prefill instance computes one sample (n=1)")
        if params.prompt_logprobs is not None:
            raise ValueError("kv_transfer_params: prompt logprobs need the whole prompt computed in one place")

    def abort_request(self, request_id: str | list[str], reason: str = "abort") -> None:
        """Abort requests by id (unknown or finished ids are ignored); their blocks are freed now."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            request = self.requests.get(rid)
            if request is None:
                continue
            for seq in request.seqs:
                if not seq.is_finished:
                    seq.stop_reason = reason
                    self._finish(seq, SequenceStatus.FINISHED_ABORTED)
            self._updated.add(rid)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ----- the step ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward pass, sample, and report requests that changed."""
        started = self.verify_cost.clock()
        self._abort_timed_out()
        self.release_kv_holds()
        self._finish_remote_kv_loads()
        if self.speculative is not None:
            self._propose_drafts()
        out = self.scheduler.schedule()
        width = self._single_decode_width(out) if self.speculative is not None else 0
        if self.drafter is not None:
            for seq in out.preempted:  # recomputed later: by the draft too
                self.drafter.free(seq)
        for seq, first_block in out.loads:
            self._start_remote_kv_load(seq, first_block)
        self.last_iteration_tokens = out.num_batched_tokens
        if out.scheduled:
            self._run(out)
        elif self._kv_loads:
            assert self.kv_connector is not None
            self.kv_connector.wait_for_loads(KV_LOAD_POLL_S)
        if width:
            self.verify_cost.record(width, self.verify_cost.clock() - started)
        return self._collect_outputs()

    @staticmethod
    def _single_decode_width(out: SchedulerOutput) -> int:
        """Tokens of the step's one sequence when it decodes (its next token and any draft), else 0:
        the steps whose times tell what a drafted token costs."""
        if len(out.scheduled) != 1:
            return 0
        seq, num_new = out.scheduled[0]
        return num_new if seq.num_output_tokens and num_new == 1 + len(seq.spec_token_ids) else 0

    def _abort_timed_out(self) -> None:
        now = time.time()
        expired = [rid for rid, r in self.requests.items() if r.deadline is not None and r.deadline <= now]
        if expired:
            self.abort_request(expired, reason="timeout")

    def _run(self, out: SchedulerOutput) -> None:
        now = time.time()
        for seq, _ in out.scheduled:
            metrics = seq.request.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                self.prompt_tokens_total += seq.num_prompt_tokens
        try:
            logits, prompt_logits = self.model_runner.execute(out.scheduled, out.block_copies)
            for seq, start, chunk_logits in prompt_logits:
                self._record_prompt_logprobs(seq.request, start, chunk_logits)
            to_sample = self._advance(out)
            beams = [(row, seq) for row, seq in to_sample if seq.request.beam is not None]
            plain = [(row, seq) for row, seq in to_sample if not seq.spec_token_ids and seq.request.beam is None]
            results = self.model_runner.sample(logits[[row for row, _ in plain]],
                                               [seq for _, seq in plain], self.eos_token_ids)
            ready_groups = self.beam_steps.record(logits, beams)
            verified = [(seq, self.model_runner.sampler.verify(
                logits[row:row + 1 + len(seq.spec_token_ids)], seq, seq.spec_token_ids, self.eos_token_ids))
                for row, seq in to_sample if seq.spec_token_ids]
        except WorkerGroupError as exc:
            self._restart_worker_group(exc)
            return
        except Exception as exc:  # a failed batch ends its requests, the engine keeps serving
            for seq, _ in out.scheduled:
                seq.request.error = f"{type(exc).__name__}: {exc}"
                for s in seq.request.seqs:
                    if not s.is_finished:
                        self._finish(s, SequenceStatus.FINISHED_ERROR)
            return
        for (_, seq), result in zip(plain, results):
            self._append_token(seq, result)
        for seq, draft_results in verified:
            self._accept_draft(seq, draft_results)
        for request in ready_groups:
            self._advance_beams(request)

    def _advance_beams(self, request: Request) -> None:
        """A beam group whose beams all have their next tokens' logprobs takes its step."""
        over = self.beam_steps.advance(request, self.max_model_len)
        self.generation_tokens_total += len(request.seqs)
        now = time.time()
        metrics = request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        else:
            metrics.inter_token_latencies.append(now - metrics.last_token_time)
        metrics.last_token_time = now
        self._updated.add(request.request_id)
        if over:
            for seq in request.seqs:
                self._finish(seq, SequenceStatus.FINISHED_LENGTH_CAPPED)
            self._note_finished(request)  # also when every beam ended with EOS (no sequence left)

    def release_kv_holds(self) -> int:
        """Free the blocks of KV transfers that ended (a prefill instance); returns how many."""
        if self.kv_connector is None:
            return 0
        released = self.kv_connector.take_released()
        self.block_manager.release(released)
        return len(released)

    def _start_remote_kv_load(self, seq: Sequence, first_block: int) -> None:
        """A decode instance: start pulling the prompt's KV from the prefill instance into the
        blocks its prefix cache did not have. The pull holds its blocks, so a request aborted
        meanwhile frees them only once nothing writes them any more."""
        assert self.kv_connector is not None
        params = seq.request.params.kv_transfer_params
        assert params is not None
        blocks = seq.block_table[first_block:]
        self._kv_loads[seq.seq_id] = (seq, self.block_manager.hold(blocks))
        self.kv_connector.start_load(seq.seq_id, params, first_block, blocks)

    def _finish_remote_kv_loads(self) -> None:
        """Loads that ended since the last step: their sequences run from this one. The last
        prompt token is computed here, so it samples as usual; a failed pull leaves the prompt to
        be computed here too (vLLM's "recompute" policy)."""
        if not self._kv_loads:
            return
        assert self.kv_connector is not None
        for seq_id, error in self.kv_connector.finished_loads():
            if (load := self._kv_loads.pop(seq_id, None)) is None:  # dropped by a group restart
                continue
            seq, held = load
            self.block_manager.release(held)
            if seq.is_finished:  # aborted while its KV came
                continue
            if error is None:
                seq.num_computed_tokens = seq.num_tokens - 1
                self.block_manager.cache_full_blocks(seq)
            else:
                logger.warning("request %s: KV transfer failed, computing its prompt here: %s",
                               seq.request.request_id, error)
            self.scheduler.loaded(seq)

    def _keep_kv_for_decode(self, seq: Sequence) -> None:
        """A prefill instance: keep the finished prompt's blocks for the decode instance to pull."""
        assert self.kv_connector is not None
        request = seq.request
        held = self.block_manager.hold(seq.block_table)
        request.kv_transfer_params = self.kv_connector.send(held, request.prompt_token_ids)

    def _start_model_runner(self, source: ModelSource) -> ModelRunner | WorkerGroupExecutor:
        """The model in this process (one rank), or the ranks in local worker processes or on Ray."""
        if self.config.tensor_parallel_size == 1:
            return ModelRunner(self.config, self.hf_config, source)
        if self.config.distributed_executor_backend == "ray":
            from llm_engine.ray_executor import RayExecutor  # imports ray: only when chosen

            return RayExecutor(self.config)
        return MultiprocExecutor(self.config)

    def _restart_worker_group(self, exc: WorkerGroupError) -> None:
        """The KV of every running request was in the lost group, as was that of requests whose KV
        was being pulled into it: fail those requests, forget the prefix cache, and start a fresh
        group (waiting requests run on it). A disaggregated instance's connector then moves KV
        between the new ranks' pools; pulls under way write only the old ones, so their blocks are
        free now, and transfers held in the old ones are dropped."""
        for seq in [*self.scheduler.running, *self.scheduler.loading]:
            seq.request.error = f"WorkerGroupError: {exc}"
            for s in seq.request.seqs:
                if not s.is_finished:
                    self._finish(s, SequenceStatus.FINISHED_ERROR)
        for _, held in self._kv_loads.values():
            self.block_manager.release(held)
        self._kv_loads.clear()
        self.block_manager.reset_prefix_cache()
        self.model_runner.restart()
        if self.kv_connector is not None:
            self.kv_connector.replace_shards(self._kv_shards())

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers and the KV connector's port."""
        if isinstance(self.model_runner, WorkerGroupExecutor):
            self.model_runner.shutdown()
        if self.kv_connector is not None:
            self.kv_connector.close()

    def _record_prompt_logprobs(self, request: Request, start: int, logits) -> None:
        """Logits of positions start.. predict prompt tokens start+1..; positions already recorded
        (computed again after a preemption) are skipped."""
        targets = request.prompt_token_ids[start + 1:start + 1 + logits.shape[0]]
        entries = self.model_runner.sampler.prompt_logprobs(logits, targets, request.params.prompt_logprobs)
        have = len(request.prompt_logprobs)
        request.prompt_logprobs.extend(entries[max(have - start - 1, 0):])

    def _advance(self, out: SchedulerOutput) -> list[tuple[int, Sequence]]:
        """Count computed tokens, cache full blocks, fork n>1 samples; return (first logit row, seq).

        A sequence with a draft has one logit row more per draft token; its draft's slots count as
        computed only once verified (_accept_draft).
        """
        to_sample: list[tuple[int, Sequence]] = []
        row = 0
        for seq, num_new in out.scheduled:
            seq.num_computed_tokens += num_new - len(seq.spec_token_ids)
            self.block_manager.cache_full_blocks(seq)
            if seq.num_computed_tokens < seq.num_tokens:
                continue
            to_sample.append((row, seq))
            row += 1 + len(seq.spec_token_ids)
            request = seq.request
            if seq.index == 0 and seq.num_output_tokens == 0 and len(request.seqs) < request.params.n:
                for index in range(1, request.params.n):
                    child = seq.fork(index)
                    self.block_manager.fork(seq, child)
                    request.seqs.append(child)
                    self.scheduler.add_running(child)
                    to_sample.append((to_sample[-1][0], child))
        return to_sample

    def _propose_drafts(self) -> None:
        """Drafts (prompt lookup or the draft model's) for running sequences that decode this step."""
        config = self.speculative
        wanted: list[tuple[Sequence, int]] = []
        for seq in self.scheduler.running:
            params = seq.request.params
            if (seq.num_computed_tokens != seq.num_tokens - 1 or seq.num_output_tokens == 0
                    or seq.request.beam is not None):
                continue  # beams rank every token of theirs: no drafts
            room = self.max_model_len - seq.num_tokens - 1
            if params.max_tokens is not None:
                room = min(room, params.max_tokens - seq.num_output_tokens - 1)
            if room <= 0:
                continue
            if seq.spec_throttle is None:
                seq.spec_throttle = SpecThrottle(config.num_speculative_tokens)
            if self.drafter is not None:
                k = min(seq.spec_throttle.allowed(self.verify_cost.relative), room)
                if k:
                    wanted.append((seq, k))
                continue
            match = find_ngram(seq.token_ids, config.prompt_lookup_max, config.prompt_lookup_min)
            if match is not None:  # the throttle prices this kind of match's draft
                k = min(seq.spec_throttle.allowed(self.verify_cost.relative, match.bucket), room)
                seq.spec_token_ids = seq.token_ids[match.start:match.start + k]
        if self.drafter is not None:
            self.drafter.propose(wanted)
        for seq in self.scheduler.running:  # masks on proposals: no verify row for what the grammar rejects
            if seq.grammar is not None and seq.spec_token_ids:
                seq.spec_token_ids = seq.grammar.check_draft(seq.spec_token_ids)

    def _accept_draft(self, seq: Sequence, results: list[SampleResult]) -> None:
        """Append the verified tokens; the accepted drafts' KV slots stay, the rest are rolled back."""
        proposed, accepted = len(seq.spec_token_ids), len(results) - 1
        seq.spec_token_ids = []
        self.spec_counters.record(proposed, accepted)
        seq.spec_throttle.record(proposed, accepted)
        for i, result in enumerate(results):
            self._append_token(seq, result)
            if seq.is_finished:
                return
            if i < accepted:  # its slot holds this very token's KV
                seq.num_computed_tokens += 1
        self.block_manager.cache_full_blocks(seq)
        self.block_manager.trim(seq)

    def _append_token(self, seq: Sequence, result: SampleResult) -> None:
        request, params = seq.request, seq.request.params
        now = time.time()
        metrics = request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        elif seq.index == 0:
            metrics.inter_token_latencies.append(now - metrics.last_token_time)
        if seq.index == 0:
            metrics.last_token_time = now
        token = result.token_id
        if seq.grammar is not None and not seq.grammar.accept(token):
            request.error = f"structured_outputs: token {token} is not allowed by the grammar here"
            self._finish(seq, SequenceStatus.FINISHED_ERROR)
            return
        seq.token_ids.append(token)
        self.generation_tokens_total += 1
        if result.top_logprobs is not None:
            seq.logprobs.append(result.top_logprobs)
            seq.cumulative_logprob += result.logprob
        self._updated.add(request.request_id)
        new_text = ""
        if self.tokenizer is not None:
            if seq.detokenizer_state is None:
                seq.detokenizer_state = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params)
            new_text = seq.detokenizer_state.decode_new(seq.token_ids)
            seq.text += new_text
        status = self._stop_status(seq, token, new_text)
        if status is not None:
            self._finish(seq, status)

    def _stop_status(self, seq: Sequence, token: int, new_text: str) -> SequenceStatus | None:
        params = seq.request.params
        if seq.grammar is not None and seq.grammar.is_terminated:
            seq.stop_reason = None
            return SequenceStatus.FINISHED_STOPPED
        if seq.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                seq.stop_reason = None
                return SequenceStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                seq.stop_reason = token
                return SequenceStatus.FINISHED_STOPPED
            if new_text and params.stop_list:
                found = find_stop_string(seq.text, len(new_text), params.stop_list,
                                         params.include_stop_str_in_output)
                if found is not None:
                    seq.text, seq.stop_reason = found
                    return SequenceStatus.FINISHED_STOPPED
        if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
            return SequenceStatus.FINISHED_LENGTH_CAPPED
        if seq.num_tokens >= self.max_model_len:
            return SequenceStatus.FINISHED_LENGTH_CAPPED
        return None

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        if (self.kv_connector is not None and self.kv_connector.config.is_producer and seq.block_table
                and seq.request.params.kv_transfer_params is not None
                and status in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH_CAPPED)):
            self._keep_kv_for_decode(seq)
        self.scheduler.finish(seq, status)
        if self.drafter is not None:
            self.drafter.free(seq)
        self._note_finished(seq.request)

    def _note_finished(self, request: Request) -> None:
        self._updated.add(request.request_id)
        if request.is_finished and request.metrics.finished_time is None:
            request.metrics.finished_time = time.time()
            for s in request.seqs:
                reason = s.status.finish_reason
                self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1

    # ----- outputs and stats -----------------------------------------------------------------

    def _collect_outputs(self) -> list[RequestOutput]:
        outputs = []
        for rid in self._updated:
            request = self.requests.get(rid)
            if request is None:
                continue
            outputs.append(self._make_output(request))
            if request.is_finished:
                del self.requests[rid]
        self._updated.clear()
        return outputs

    def _make_output(self, request: Request) -> RequestOutput:
        if request.beam is not None:
            return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids,
                                 beam_completions(request, self.tokenizer), request.is_finished,
                                 request.metrics, request.error)
        completions = []
        holdback = max((len(s) for s in request.params.stop_list), default=1) - 1
        for seq in request.seqs:
            text = seq.text
            if not seq.is_finished and holdback:
                text = text[:max(len(text) - holdback, 0)]  # may still become part of a stop string
            completions.append(CompletionOutput(
                index=seq.index, text=text, token_ids=list(seq.output_token_ids),
                cumulative_logprob=seq.cumulative_logprob if request.params.logprobs is not None else None,
                logprobs=list(seq.logprobs) if request.params.logprobs is not None else None,
                finish_reason=seq.status.finish_reason, stop_reason=seq.stop_reason))
        prompt_logprobs = list(request.prompt_logprobs) if request.prompt_logprobs is not None else None
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, completions,
                             request.is_finished, request.metrics, request.error, prompt_logprobs,
                             request.kv_transfer_params)

    def kv_cache_occupancy(self) -> tuple[int, int]:
        """(slots in blocks held by live sequences, of those the slots holding a computed token).

        A block shared by several sequences counts once. Their ratio is the paged cache's waste.
        """
        bm = self.block_manager
        bs = bm.block_size
        filled: dict[int, int] = {}
        for seq in self.scheduler.running:
            for i, block_id in enumerate(seq.block_table):
                used = min(bs, max(seq.num_computed_tokens - i * bs, 0))
                filled[block_id] = max(filled.get(block_id, 0), used)
        return (bm.num_blocks - bm.num_free_blocks) * bs, sum(filled.values())

    def get_stats(self) -> EngineStats:
        bm = self.block_manager
        cache = getattr(self.model_runner, "encoder_cache", None)
        return EngineStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=bm.usage, num_free_blocks=bm.num_free_blocks, num_total_blocks=bm.num_blocks,
            prefix_cache_queries=bm.prefix_queries, prefix_cache_hits=bm.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions, prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            last_iteration_tokens=self.last_iteration_tokens,
            finished_by_reason=dict(self.finished_by_reason),
            mm_cache_queries=cache.queries if cache else 0, mm_cache_hits=cache.hits if cache else 0,
            spec_decode_num_drafts=self.spec_counters.num_drafts,
            spec_decode_num_draft_tokens=self.spec_counters.num_draft_tokens,
            spec_decode_num_accepted_tokens=self.spec_counters.num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=list(self.spec_counters.accepted_per_pos))
