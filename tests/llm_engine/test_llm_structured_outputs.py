"""Structured outputs on a tiny random Llama over SmolLM2's vocabulary: every constrained output
parses and validates, constrained rows leave the other rows of a batch alone, and the constraint
survives preemption, prefix caching, n > 1 and speculative decoding."""

from __future__ import annotations

import json
import os
import random
import re

import jsonschema_rs
import pytest
import torch

from llm_engine import LLM, SamplingParams
from llm_engine.structured_outputs import StructuredOutputsParams

PATTERNS = [r"^[a-z]{1,6}$", r"^\d{3}-\d{2}$", r"^(foo|bar)[0-9]?$", r"^[A-F0-9]{4}$"]
# The 200 schemas take ~50 s here: the default suite runs 30, `CODEYARD_SO_SCHEMAS=200` all.
NUM_SCHEMAS = int(os.environ.get("CODEYARD_SO_SCHEMAS", "30"))
PROMPTS = ["Return the result as JSON:", "def parse(config):", "The answer is", "{", "Hello"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON schema whose every value is bounded (a random model would otherwise write strings
    and numbers until max_tokens): nested objects, arrays, enums, numbers, patterned strings."""
    kinds = ["integer", "number", "string", "pattern", "enum", "boolean", "null"]
    if depth < 2:
        kinds += ["array", "object", "object"]
    kind = rng.choice(kinds)
    if kind == "integer":
        low = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 5000)}
    if kind == "number":
        return {"type": "number", "minimum": rng.choice([-10, 0, 1]), "maximum": rng.choice([10, 99])}
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(2, 10)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", 3, None, True, "a b", 2.5], rng.randint(1, 4))}
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": rng.randint(0, 1),
                "maxItems": rng.randint(1, 3)}
    names = rng.sample(["id", "name", "tags", "size", "ok", "kind", "items", "meta"], rng.randint(1, 4))
    props = {name: random_schema(rng, depth + 1) for name in names}
    return {"type": "object", "properties": props, "required": rng.sample(names, rng.randint(0, len(names))),
            "additionalProperties": False}


def top_schema(rng: random.Random) -> dict:
    schema = random_schema(rng, 1)
    while schema.get("type") != "object":
        schema = random_schema(rng, 1)
    return schema


def constrained(temperature: float, seed: int | None = None, max_tokens: int = 200, **kind) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens,
                          structured_outputs=StructuredOutputsParams(**kind))


@pytest.fixture(scope="module")
def llm(tiny_llama_smollm_vocab):
    return LLM(model=str(tiny_llama_smollm_vocab), dtype="float32")


def assert_valid_json(text: str, schema: dict) -> None:
    assert jsonschema_rs.is_valid(schema, json.loads(text)), f"{text!r} does not validate against {schema}"


def test_generated_json_schemas_always_validate(llm):
    rng = random.Random(18)
    schemas = [top_schema(rng) for _ in range(NUM_SCHEMAS)]
    params = [constrained(0.0 if i % 2 else 1.0, seed=i, json=schema) for i, schema in enumerate(schemas)]
    outputs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(len(schemas))], params, use_tqdm=False)
    for schema, out in zip(schemas, outputs):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", (schema, completion.text)
        assert_valid_json(completion.text, schema)


def test_regex_choice_grammar_and_json_object(llm):
    regexes = [r"[a-c]{2,5}-\d{1,3}", r"(yes|no|maybe)!?", r"0x[0-9a-f]{2,8}", r"\w{1,4}( \w{1,4}){0,2}"]
    choices = ["refactor", "add tests", "rename \"x\"", "ça va"]
    grammar = 'root ::= "(" num (" + " num){0,3} ")"\nnum ::= [1-9] [0-9]{0,2}'
    params = ([constrained(t, seed=s, regex=r) for r in regexes for t, s in ((0.0, None), (1.0, 1))]
              + [constrained(t, seed=s, choice=choices) for t, s in ((0.0, None), (1.2, 5))]
              + [constrained(t, seed=s, grammar=grammar) for t, s in ((0.0, None), (1.0, 6))])
    outputs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(len(params))], params, use_tqdm=False)
    texts = [out.outputs[0].text for out in outputs]
    assert all(out.outputs[0].finish_reason == "stop" for out in outputs), texts
    for text, p in zip(texts, params):
        so = p.structured_outputs
        if so.regex is not None:
            assert re.fullmatch(so.regex, text), (so.regex, text)
        elif so.choice is not None:
            assert text in choices
        else:
            assert re.fullmatch(r"\([1-9]\d{0,2}( \+ [1-9]\d{0,2}){0,3}\)", text), text
    # Any object: a random model may write one unbounded string until max_tokens, some samples end.
    objects = llm.generate(["{"] * 2, [constrained(1.0, seed=s, max_tokens=40, json_object=True) for s in (1, 2)],
                           use_tqdm=False)
    ended = [o.outputs[0].text for o in objects if o.outputs[0].finish_reason == "stop"]
    assert ended and all(isinstance(json.loads(text), dict) for text in ended)
    assert all(o.outputs[0].text.startswith("{") for o in objects)


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(llm):
    prompts = ["def add(a, b):", "Once upon a time", "import os\n", "The quick brown fox"]
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, free, use_tqdm=False)]
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"]}
    mixed_params = [free, constrained(0.0, json=schema), free, constrained(1.0, seed=3, regex=r"[xyz]{3}"),
                    free, constrained(0.0, choice=["a", "b"]), free]
    mixed_prompts = [prompts[0], "JSON:", prompts[1], "go", prompts[2], "pick", prompts[3]]
    mixed = llm.generate(mixed_prompts, mixed_params, use_tqdm=False)
    assert [mixed[i].outputs[0].token_ids for i in (0, 2, 4, 6)] == alone
    assert_valid_json(mixed[1].outputs[0].text, schema)
    assert re.fullmatch(r"[xyz]{3}", mixed[3].outputs[0].text)
    assert mixed[5].outputs[0].text in ("a", "b")


def test_samples_walk_their_own_grammar_and_ignore_eos_still_ends(llm):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                        "maxItems": 4}}, "required": ["tags"]}
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=60, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(json=schema))
    out = llm.generate("Tags:", params, use_tqdm=False)[0]
    assert len(out.outputs) == 4
    for sample in out.outputs:
        assert sample.finish_reason == "stop"  # the grammar ended it, though EOS is ignored
        assert_valid_json(sample.text, schema)
    assert len({s.text for s in out.outputs}) > 1


def test_preemption_prefix_caching_and_speculation_keep_outputs(tiny_llama_smollm_vocab):
    """A pool of a few blocks forces preemptions (recomputed from the cached prefix) with prompt
    lookup on for constrained and free rows alike. Greedy outputs equal a roomy engine's."""
    rng = random.Random(7)
    schemas = [top_schema(rng) for _ in range(5)]
    shared = "You are a careful assistant. Answer only with JSON that matches the schema. " * 2
    prompts = [shared + str(i) for i in range(len(schemas))]
    params = [constrained(0.0, json=s) for s in schemas] + [SamplingParams(temperature=0, max_tokens=30,
                                                                           ignore_eos=True)]
    prompts.append(shared + " def f(x): return f(x) + f(x) + f(x)")
    roomy = LLM(model=str(tiny_llama_smollm_vocab), dtype="float32")
    reference = [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
    tight = LLM(model=str(tiny_llama_smollm_vocab), dtype="float32", num_kv_blocks=24, block_size=8,
                speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    outputs = tight.generate(prompts, params, use_tqdm=False)
    stats = tight.engine.get_stats()  # taken after the last step, before anything else runs
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.spec_decode_num_drafts > 0
    assert [o.outputs[0].token_ids for o in outputs] == reference
    for schema, out in zip(schemas, outputs):
        assert_valid_json(out.outputs[0].text, schema)
    assert tight.engine.block_manager.num_free_blocks == stats.num_total_blocks  # nothing leaked


COPY_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "size": {"type": "integer", "minimum": 0, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "size", "tags", "ok"], "additionalProperties": False}
COPY_PROMPT = 'Record: {"name":"lookup","size":42,"tags":["alpha","gamma"],"ok":true}\nSame record as JSON: '


def test_constrained_drafts_are_verified_under_each_rows_mask(tiny_llama_smollm_vocab):
    """Masks on proposals: prompt lookup drafts for constrained rows too (JSON schemas, regex,
    choice, beside free rows in one batch); greedy outputs equal those without speculation and
    drafted tokens were accepted."""
    rng = random.Random(18)
    schemas = [COPY_SCHEMA] + [top_schema(rng) for _ in range(3)]
    params = ([constrained(0.0, json=schema) for schema in schemas]
              + [constrained(0.0, regex=r'\{"name":"[a-z]{1,8}","size":\d{1,3}\}'),
                 constrained(0.0, choice=['{"name":"lookup"}', '{"name":"other"}', "none"]),
                 SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)])
    prompts = [COPY_PROMPT] * len(params)
    plain = LLM(model=str(tiny_llama_smollm_vocab), dtype="float32")
    reference = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    spec = LLM(model=str(tiny_llama_smollm_vocab), dtype="float32",
               speculative_config={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4})
    constrained_only = spec.generate(prompts[:-1], params[:-1], use_tqdm=False)
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_accepted_tokens > 0
    assert [o.outputs[0].token_ids for o in constrained_only] == reference[:-1]
    mixed = spec.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed] == reference
    for schema, out in zip(schemas, mixed):
        assert out.outputs[0].finish_reason == "stop"
        assert_valid_json(out.outputs[0].text, schema)
    assert re.fullmatch(r'\{"name":"[a-z]{1,8}","size":\d{1,3}\}', mixed[len(schemas)].outputs[0].text)
    assert mixed[len(schemas) + 1].outputs[0].text in ('{"name":"lookup"}', '{"name":"other"}', "none")


def test_a_draft_models_proposals_are_cut_by_the_grammar(llm, tiny_llama_smollm_vocab):
    """The draft model (here the target itself, so its unmasked argmax) proposes what the grammar
    may reject: cut there, greedy outputs equal the plain engine's and drafts are accepted."""
    params = [constrained(0.0, json=COPY_SCHEMA), constrained(0.0, regex=r"[a-z]{2,6}( [a-z]{2,6}){0,3}")]
    reference = [o.outputs[0].token_ids for o in llm.generate([COPY_PROMPT] * 2, params, use_tqdm=False)]
    spec = LLM(model=str(tiny_llama_smollm_vocab), dtype="float32",
               speculative_config={"model": str(tiny_llama_smollm_vocab), "num_speculative_tokens": 4})
    assert [o.outputs[0].token_ids for o in spec.generate([COPY_PROMPT] * 2, params, use_tqdm=False)] == reference
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_accepted_tokens > 0


def test_sampled_constrained_drafts_keep_samples_valid(tiny_llama_smollm_vocab):
    """Sampling with speculation, n > 1: every sample still validates and ends by its grammar."""
    llm = LLM(model=str(tiny_llama_smollm_vocab), dtype="float32",
              speculative_config={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4})
    params = SamplingParams(n=3, temperature=0.7, seed=5, max_tokens=80,
                            structured_outputs=StructuredOutputsParams(json=COPY_SCHEMA))
    out = llm.generate([COPY_PROMPT, COPY_PROMPT], params, use_tqdm=False)
    assert llm.engine.get_stats().spec_decode_num_drafts > 0
    for sample in (s for o in out for s in o.outputs):
        assert sample.finish_reason == "stop", sample.text
        assert_valid_json(sample.text, COPY_SCHEMA)


def test_draft_is_cut_at_the_first_rejected_token_and_the_matcher_rolled_back(llm):
    """check_draft keeps the grammar's prefix of a draft, stops before the token that would end
    the grammar, fills row i with the mask after draft[:i] and leaves the matcher where it was."""
    import xgrammar

    tokenizer = llm.get_tokenizer()
    grammar = llm.engine._compile_grammar(constrained(0.0, regex=r"ab[cd]{1,4}"))
    assert grammar is not None

    def ids(text: str) -> list[int]:
        return [tokenizer.convert_tokens_to_ids(ch) for ch in text]

    def mask_after(prefix: list[int]) -> torch.Tensor:
        state = grammar.new_state()
        assert all(state.accept(t) for t in prefix)
        bitmask = xgrammar.allocate_token_bitmask(1, grammar.vocab_size)
        state.fill(bitmask, 0)
        return bitmask[0]

    state = grammar.new_state()
    assert state.accept(ids("a")[0])
    before = mask_after(ids("a"))
    draft = ids("bcdxc")  # "x" is not allowed: cut there
    assert state.check_draft(draft) == draft[:3]
    for i in range(4):
        assert torch.equal(state._draft_bitmask[i], mask_after(ids("a") + draft[:i]))
    after = xgrammar.allocate_token_bitmask(1, grammar.vocab_size)
    state.fill(after, 0)
    assert torch.equal(after[0], before)  # rolled back
    full = ids("bcddd") + [tokenizer.eos_token_id]
    assert state.check_draft(full) == full[:5]  # the stop token is the target's to give
    assert not state.is_terminated


@pytest.mark.parametrize(("kind", "message"), [
    ({"json": {"type": "strin"}}, 'invalid JSON schema: Unsupported type "strin"'),
    ({"json": "{not json"}, "invalid JSON schema"),
    ({"json": "[1, 2]"}, "a JSON schema must be an object"),
    ({"regex": "[a-z"}, "invalid regex: Regex parsing error at position 5: Unclosed '['"),
    ({"grammar": "root ::= missing"}, 'invalid grammar: EBNF parser error at line 1, column 10: Rule "missing"'),
])
def test_invalid_constraints_are_value_errors_naming_the_reason(llm, kind, message):
    with pytest.raises(ValueError, match="structured_outputs: ") as err:
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(**kind)), use_tqdm=False)
    assert message in str(err.value)
    assert not llm.engine.has_unfinished_requests()


def test_params_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams(json={}, regex="a")
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="choice must be a non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="structured_outputs: must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs={"json": {}})  # type: ignore[arg-type]
