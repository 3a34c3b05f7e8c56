"""max_retries: refused attempts rerun with derived seeds and prefix hits; the caller sees one request."""

import json

import pytest
from transformers import GenerationConfig

import hf_paged
from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, RegexLogitsProcessor, SamplingParams
from hf_paged.batching.retry import retry_seed
from hf_paged.errors import InvalidConfigError
from tests.batching.test_constrained_engine import SCHEMA, model_and_tokenizer

PROMPT = "Tell me about 3 cats as JSON, please:"  # 37 byte tokens: 4 full blocks of 8


def refuse_first(num_refused: int = 1):
    """A validator that refuses the first `num_refused` texts it sees, and records them all."""
    seen: list = []

    def validator(text) -> bool:
        seen.append(text)
        return len(seen) > num_refused

    return validator, seen


def run(engine: Engine, prompts, params) -> list:
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return [engine.pop_output(rid) for rid in ids]


def sampled(tok, proc, **kwargs) -> SamplingParams:
    return SamplingParams(max_new_tokens=60, do_sample=True, seed=11, eos_token_id=tok.eos_token_id,
                          logits_processors=[proc], tokenizer=tok, **kwargs)


def test_a_refused_attempt_reruns_with_a_new_seed_and_a_prefix_hit():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    validator, seen = refuse_first()
    engine = Engine(model, PagedConfig(block_size=8))
    (out,) = run(engine, [tok(PROMPT)["input_ids"]], [sampled(tok, proc, max_retries=2, validator=validator)])
    assert [a.valid for a in out.attempts] == [False, True]
    first, second = out.attempts
    assert first.seed == 11 and second.seed == retry_seed(11, 0, 1) != 11
    assert first.generated_tokens != second.generated_tokens  # another seed, another document
    assert out.generated_tokens == second.generated_tokens and out.finish_reason == second.finish_reason == "stop"
    assert seen == [tok.decode(a.generated_tokens, skip_special_tokens=True) for a in out.attempts]
    # every prompt token but the last, reused: 4 full blocks and 4 tokens copied from the first attempt's fifth
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 36
    assert out.num_cached_tokens == 36
    stats = engine.stats()
    assert stats["retries"] == stats["retried_requests"] == 1
    assert stats["requests_finished"] == 1 and stats["prompt_tokens_cached"] == 36


def test_retries_exhausted_return_the_last_attempt():
    model, tok = model_and_tokenizer()
    proc = RegexLogitsProcessor(r"(cat|dog)s? [0-9]{1,3}\.", tok)
    engine = Engine(model, PagedConfig(block_size=8))
    (out,) = run(engine, [tok(PROMPT)["input_ids"]], [sampled(tok, proc, max_retries=2, validator=lambda t: False)])
    assert len(out.attempts) == 3 and all(a.valid is False for a in out.attempts)
    assert out.generated_tokens == out.attempts[-1].generated_tokens
    assert [a.seed for a in out.attempts] == [11, retry_seed(11, 0, 1), retry_seed(11, 0, 2)]
    assert engine.stats()["retries"] == 2


def test_a_document_cut_short_is_retried_until_the_attempts_run_out():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    engine = Engine(model, PagedConfig(block_size=8))
    params = sampled(tok, proc, max_retries=1).replace(max_new_tokens=6)  # no document fits in 6 tokens
    (out,) = run(engine, [tok(PROMPT)["input_ids"]], [params])
    assert [(a.finish_reason, a.valid, a.num_tokens) for a in out.attempts] == [("length_incomplete", None, 6)] * 2
    assert out.finish_reason == "length_incomplete"


def test_the_default_validator_checks_the_json_schema():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    engine = Engine(model, PagedConfig(block_size=8))
    (out,) = run(engine, [tok(PROMPT)["input_ids"]], [sampled(tok, proc, max_retries=3).replace(tokenizer=None)])
    assert [a.valid for a in out.attempts] == [True]  # decoded with the constraint's own vocabulary
    assert json.loads(tok.decode(out.generated_tokens, skip_special_tokens=True))["kind"] in ("cat", "dog")


def test_retries_are_reproducible_and_leave_the_other_requests_alone():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    prompts = [tok(p)["input_ids"] for p in (PROMPT, "Pets: ", "{")]
    others = [SamplingParams(max_new_tokens=30, eos_token_id=tok.eos_token_id),
              sampled(tok, proc).replace(seed=5)]
    alone = run(Engine(model, PagedConfig(block_size=8)), prompts[1:], others)
    outs = []
    for _ in range(2):
        validator, _ = refuse_first(2)
        params = [sampled(tok, proc, max_retries=3, validator=validator)] + others
        outs.append(run(Engine(model, PagedConfig(block_size=8)), prompts, params))
    assert [a.generated_tokens for a in outs[0][0].attempts] == [a.generated_tokens for a in outs[1][0].attempts]
    assert len(outs[0][0].attempts) == 3
    for together, by_itself in zip(outs[0][1:], alone):
        assert together.generated_tokens == by_itself.generated_tokens and together.attempts is None


def test_a_retried_request_streams_only_its_final_attempt():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    engine = Engine(model, PagedConfig(block_size=8))
    validator, _ = refuse_first()
    rid = engine.add_request(tok(PROMPT)["input_ids"], sampled(tok, proc, max_retries=1, validator=validator))
    streamed = [tokens for _, tokens, _ in engine.stream([rid])]
    out = engine.pop_output(rid)
    assert streamed == [out.generated_tokens] and len(out.attempts) == 2


def test_a_raising_validator_fails_its_request_only():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)

    def broken(text):
        raise KeyError("oops")

    engine = Engine(model, PagedConfig(block_size=8))
    bad, good = run(engine, [tok(PROMPT)["input_ids"]] * 2,
                    [sampled(tok, proc, max_retries=1, validator=broken), sampled(tok, proc)])
    assert bad.finish_reason == "error" and "validator raised KeyError" in bad.error
    assert good.finish_reason == "stop"


def test_generate_batch_takes_retries_from_sampling_params_and_kwargs():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    hf_paged.wrap(model, block_size=8)
    try:
        validator, _ = refuse_first()
        outs = model.generate_batch([tok(PROMPT)["input_ids"]],
                                    sampling_params=sampled(tok, proc, max_retries=1, validator=validator))
        assert [a.valid for a in outs["req_0"].attempts] == [False, True]
        outs = model.generate_batch([tok(PROMPT)["input_ids"]], GenerationConfig(max_new_tokens=6, do_sample=True),
                                    logits_processor=[proc], max_retries=1, constraint_mode="resample")
        assert [a.finish_reason for a in outs["req_0"].attempts] == ["length_incomplete"] * 2
    finally:
        hf_paged.unwrap(model)


@pytest.mark.parametrize("kwargs, words", [
    ({"max_retries": -1}, "max_retries must be an int in \\[0, 100\\]"),
    ({"max_retries": 1.5}, "max_retries must be an int in \\[0, 100\\]"),
    ({"max_retries": True}, "max_retries must be an int in \\[0, 100\\]"),
    ({"max_retries": 2, "validator": "json", "do_sample": True}, "validator must be a callable"),
    ({"validator": lambda t: True}, "max_retries=0"),
])
def test_bad_retry_arguments_raise_typed_errors(kwargs, words):
    with pytest.raises(InvalidConfigError, match=words):
        SamplingParams(**kwargs)


def test_greedy_retries_and_unbounded_retries_are_refused():
    """A greedy rerun repeats its attempt (max_retries=5 ran 6 identical generations; 10**6 ran until killed)."""
    from hf_paged.batching.sampling import MAX_RETRIES
    from hf_paged.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="a greedy request repeats the same attempt: set do_sample=True"):
        SamplingParams(max_retries=2)
    with pytest.raises(InvalidConfigError, match=f"max_retries must be an int in \\[0, {MAX_RETRIES}\\]"):
        SamplingParams(do_sample=True, max_retries=10**6)
    SamplingParams(do_sample=True, max_retries=MAX_RETRIES)
