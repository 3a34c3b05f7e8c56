"""Engine behaviour: processors, faults, aborts, streaming, outputs, metrics, soak."""

import random

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, NoBadWordsLogitsProcessor, RepetitionPenaltyLogitsProcessor

import hf_paged
from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.batching.request import fork_ids
from hf_paged.errors import SamplingError, UnsupportedGenerationError
from tests.tiny_models import VOCAB, left_pad, ragged_prompts, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_user_logits_processors_match_stock(model):
    prompts = ragged_prompts([7, 19, 30], seed=5)
    procs = [RepetitionPenaltyLogitsProcessor(1.8), NoBadWordsLogitsProcessor([[10], [20, 21]], eos_token_id=None)]
    ids, mask = left_pad(prompts)
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, logits_processor=procs)
    hf_paged.wrap(model, max_num_batched_tokens=16)
    try:
        wrapped = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, logits_processor=procs)
        batch = model.generate_batch(prompts, GenerationConfig(max_new_tokens=20), logits_processor=procs)
    finally:
        hf_paged.unwrap(model)
    assert torch.equal(wrapped, stock)
    for i, out in enumerate(batch.values()):
        assert out.generated_tokens == stock[i, ids.shape[1]:].tolist()
        assert 10 not in out.generated_tokens


class Exploding(LogitsProcessor):
    def __call__(self, input_ids, scores):
        raise RuntimeError("boom")


def test_faulty_requests_fail_alone_and_pool_is_whole(model):
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32))
    good = [engine.add_request(p, SamplingParams(max_new_tokens=8)) for p in ragged_prompts([6, 9], seed=2)]
    bad = {
        "empty": engine.add_request([], SamplingParams(max_new_tokens=8)),
        "vocab": engine.add_request([1, VOCAB + 5, 2], SamplingParams(max_new_tokens=8)),
        "long": engine.add_request([3] * 600, SamplingParams(max_new_tokens=8)),
        "pool": engine.add_request([3] * 300, SamplingParams(max_new_tokens=8)),
        "processor": engine.add_request([4, 5, 6], SamplingParams(max_new_tokens=8, logits_processors=[Exploding()])),
    }
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    for i in good:
        out = engine.pop_output(i)
        assert out.status is RequestStatus.FINISHED and len(out.generated_tokens) == 8
    errors = {k: engine.pop_output(v) for k, v in bad.items()}
    assert all(o.status is RequestStatus.FAILED for o in errors.values())
    assert "empty prompt" in errors["empty"].error
    assert "outside the vocabulary" in errors["vocab"].error
    assert "maximum of 512 positions" in errors["long"].error
    assert "raise PagedConfig.num_blocks" in errors["pool"].error
    assert "boom" in errors["processor"].error
    assert engine.cache.pool.num_free_blocks == 64


@pytest.mark.parametrize("policy", ["budget", "remaining"])
def test_the_request_that_outgrew_the_pool_fails_not_the_one_waiting(model, policy):
    """A step that only preempted made room, it did not find a request that can never fit (h53: the waiting
    request that fits failed with OutOfBlocksError, and the one that outgrew the pool went on)."""
    engine = Engine(model, PagedConfig(block_size=16, num_blocks=11, max_num_batched_tokens=23,
                                       scheduling_policy=policy))
    big = engine.add_request([7] * 143, SamplingParams(max_new_tokens=39))  # 182 tokens: past 11 x 16
    engine.step()
    small = engine.add_request([5] * 21, SamplingParams(max_new_tokens=6), priority=1)
    outs = engine.run()
    assert outs[big].status is RequestStatus.FAILED and "raise PagedConfig.num_blocks" in outs[big].error
    assert outs[small].status is RequestStatus.FINISHED and len(outs[small].generated_tokens) == 6
    assert engine.cache.pool.num_used_blocks == 0


def test_the_request_admission_stopped_on_fails_not_the_queue_head(model):
    """Admission takes the longest cached prefix first; the request it stopped on is the one that fails (h53: the
    queue's head, which fits, failed)."""
    engine = Engine(model, PagedConfig(block_size=1, num_blocks=40, max_num_seqs=1))
    shared = list(range(10, 40))
    first = engine.add_request(shared + [1], SamplingParams(max_new_tokens=2))
    fits = engine.add_request(list(range(50, 60)), SamplingParams(max_new_tokens=5))
    outgrows = engine.add_request(shared + [2, 3], SamplingParams(max_new_tokens=20))
    outs = engine.run()
    assert outs[first].status is RequestStatus.FINISHED and outs[fits].status is RequestStatus.FINISHED
    assert outs[outgrows].status is RequestStatus.FAILED and "raise PagedConfig.num_blocks" in outs[outgrows].error


def test_a_refused_request_ends_with_its_forks(model):
    """n > 1 and a prompt refused at add_request: every fork id has the refusal as its output (h53: only the parent
    existed; the forks raised KeyError, and generate_batch waited for the engine to go idle)."""
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=8))
    rid = engine.add_request(list(range(3, 60)), SamplingParams(max_new_tokens=4, num_return_sequences=3))
    outs = [engine.pop_output(i) for i in fork_ids(rid, 3)]
    assert all(o.status is RequestStatus.FAILED and "needs 15 blocks but the pool has 8" in o.error for o in outs)
    assert not engine.has_unfinished and engine.cache.pool.num_used_blocks == 0


def test_aborting_a_request_ends_its_running_forks(model):
    """abort(request_id) ends every sequence of an n > 1 request, the forks already running on their own included
    (h53: they went on to the end); a fork id aborts that fork alone."""
    engine = Engine(model, PagedConfig(block_size=4))
    rid = engine.add_request([3, 4, 5, 6], SamplingParams(max_new_tokens=40, num_return_sequences=3))
    for _ in range(3):
        engine.step()
    ids = fork_ids(rid, 3)
    assert all(engine.requests[i].status is RequestStatus.RUNNING for i in ids)
    engine.abort(ids[2])
    assert engine.requests[ids[2]].ended and not engine.requests[ids[1]].ended
    engine.abort(rid)
    assert not engine.has_unfinished and engine.cache.pool.num_used_blocks == 0
    assert [engine.pop_output(i).finish_reason for i in ids] == ["abort"] * 3


def test_abort_frees_blocks_at_once(model):
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, enable_prefix_caching=False))
    rid = engine.add_request(list(range(3, 30)), SamplingParams(max_new_tokens=50))
    engine.step()
    assert engine.cache.pool.num_free_blocks < 64
    engine.abort(rid)
    assert engine.cache.pool.num_free_blocks == 64
    out = engine.pop_output(rid)
    assert out.status is RequestStatus.FAILED and out.finish_reason == "abort"
    engine.check_integrity()


def test_soak_random_requests_and_aborts_leak_nothing(model):
    rng = random.Random(0)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=160, max_num_seqs=40))
    live: list[str] = []
    for n in range(2000):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))]
        live.append(engine.add_request(prompt, SamplingParams(max_new_tokens=rng.randint(1, 4))))
        if rng.random() < 0.2 and live:
            engine.abort(live.pop(rng.randrange(len(live))))
        if n % 10 == 0:
            engine.step()
            engine.check_integrity()
    while engine.has_unfinished:
        engine.step()
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0
    assert engine.stats()["requests_finished"] + engine.stats()["requests_aborted"] == 2000


def test_generate_batch_edges(model, capsys):
    hf_paged.wrap(model)
    try:
        assert model.generate_batch([]) == {}
        with pytest.raises(UnsupportedGenerationError, match="num_beams=2"):
            model.generate_batch([[1, 2, 3]], GenerationConfig(num_beams=2, max_new_tokens=4))
        outs = model.generate_batch([[5, 6, 7]], GenerationConfig(max_new_tokens=3, num_return_sequences=3,
                                                                   do_sample=True), progress_bar=True)
        assert list(outs) == ["req_0", "req_0__child#0", "req_0__child#1"]
        assert all(len(o.generated_tokens) == 3 for o in outs.values())
        assert "3/3" in capsys.readouterr().err  # the bar counts the ended requests (it stayed at 0/3)
    finally:
        hf_paged.unwrap(model)


def test_forks_waiting_for_their_parent_count_as_waiting(model):
    """`num_waiting` and `stats()["requests_waiting"]` count sequences: a queued request of n=3 is 3 (its forks wait
    outside the scheduler's queue for the parent's first token), and none once they run."""
    engine = Engine(model, PagedConfig(block_size=4))
    engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=3, num_return_sequences=3, temperature=1.0, seed=0))
    assert engine.num_waiting == engine.stats()["requests_waiting"] == 3
    engine.step()
    assert engine.num_waiting == engine.stats()["requests_waiting"] == 0
    assert engine.stats()["requests_running"] == 3


def test_stream_and_step_outputs(model):
    engine = Engine(model, PagedConfig(block_size=4))
    a = engine.add_request([3, 4, 5], SamplingParams(max_new_tokens=5))
    b = engine.add_request([6, 7], SamplingParams(max_new_tokens=3))
    seen: dict[str, list[int]] = {a: [], b: []}
    finished = set()
    for rid, tokens, done in engine.stream():
        seen[rid].extend(tokens)
        if done:
            finished.add(rid)
    assert finished == {a, b}
    assert len(seen[a]) == 5 and len(seen[b]) == 3
    assert engine.pop_output(a).generated_tokens == seen[a]


def test_sampling_is_seeded_per_request(model):
    def run():
        engine = Engine(model, PagedConfig())
        params = SamplingParams(max_new_tokens=12, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=7)
        rid = engine.add_request([3, 4, 5, 6], params)
        engine.add_request([9, 9, 9], SamplingParams(max_new_tokens=30, do_sample=True))  # noise around it
        return engine.run([rid])[rid].generated_tokens

    assert run() == run()


def test_forks_do_not_repeat_another_seeds_stream(model):
    """Fork k of a seeded request draws from a seed derived from it (h55: fork 1 of seed 200 gave exactly request
    seed 201's tokens, when fork seeds were seed + k + 1)."""
    engine = Engine(model, PagedConfig())
    sampled = {"max_new_tokens": 16, "do_sample": True, "temperature": 1.5}
    forked = engine.add_request([3, 4, 5, 6], SamplingParams(num_return_sequences=2, seed=200, **sampled))
    alone = engine.add_request([3, 4, 5, 6], SamplingParams(seed=201, **sampled))
    ids = [*fork_ids(forked, 2), alone]
    outs = engine.run(ids)
    assert outs[ids[1]].generated_tokens != outs[alone].generated_tokens


def test_stop_conditions(model):
    engine = Engine(model, PagedConfig())
    free_run = engine.run([engine.add_request([3, 4, 5], SamplingParams(max_new_tokens=10))])
    tokens = next(iter(free_run.values())).generated_tokens
    stop_at = tokens[4]
    rid = engine.add_request([3, 4, 5], SamplingParams(max_new_tokens=10, eos_token_id=[stop_at]))
    out = engine.run([rid])[rid]
    assert out.generated_tokens == tokens[: tokens.index(stop_at) + 1]
    assert out.finish_reason == "stop"
    rid = engine.add_request([3, 4, 5], SamplingParams(max_new_tokens=10, eos_token_id=stop_at, min_new_tokens=10))
    assert engine.run([rid])[rid].finish_reason == "length"


def test_stats_report_metrics(model):
    engine = Engine(model, PagedConfig(max_num_batched_tokens=32))
    engine.run([engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in ragged_prompts([5, 50, 9])])
    stats = engine.stats()
    for key in ("requests_finished", "prompt_tokens", "generated_tokens", "tokens_per_step", "batch_utilization",
                "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "preemptions", "blocks_used", "blocks_total",
                "kv_usage", "prefix_hit_rate"):
        assert key in stats
    assert stats["requests_finished"] == 3 and stats["generated_tokens"] == 18
    assert 0 < stats["batch_utilization"] <= 1


class _NaNScores(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores * float("nan")


class _ReturnsNone(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return None


def test_a_row_that_cannot_be_sampled_fails_only_its_request(model):
    """A temperature that overflows the logits, a processor that writes NaN or returns None: that request fails with
    `SamplingError` naming it, and the greedy requests beside it finish with their solo tokens (before, the draw
    raised out of the step and failed every request in flight)."""
    engine = Engine(model, PagedConfig(block_size=4))
    alone = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6))
    outs = {}
    while engine.has_unfinished:
        outs.update((o.request_id, o) for o in engine.step().finished)
    solo = outs[alone].generated_tokens
    good = [engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6)) for _ in range(2)]
    bad = [engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6, do_sample=True, temperature=1e-40, seed=0)),
           engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6, do_sample=True, seed=0,
                                                        logits_processors=[_NaNScores()])),
           engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=6, logits_processors=[_ReturnsNone()]))]
    while engine.has_unfinished:
        outs.update((o.request_id, o) for o in engine.step().finished)
    assert [outs[r].generated_tokens for r in good] == [solo, solo]
    assert [outs[r].status for r in bad] == [RequestStatus.FAILED] * 3
    assert all(outs[r].error_type is SamplingError for r in bad)
    assert "temperature=1e-40" in outs[bad[0]].error and "returned NoneType" in outs[bad[2]].error
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0


@pytest.mark.parametrize("eos", ["x", [1, "a"], True, 3.0])
def test_an_eos_that_is_not_a_token_id_is_refused_up_front(eos):
    with pytest.raises(ValueError, match="eos_token_id must be None, a token id or a list"):
        SamplingParams(eos_token_id=eos)


@pytest.mark.parametrize("temperature", [float("inf"), float("nan"), -1.0])
def test_a_temperature_that_is_not_finite_is_refused(temperature):
    with pytest.raises(ValueError, match="finite number >= 0"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"min_new_tokens": -1}, ValueError, "min_new_tokens must be an int >= 0"),
    ({"logits_processors": lambda ids, scores: scores}, TypeError, "logits_processors must be a list of callables"),
    ({"logits_processors": [1]}, TypeError, "logits_processors must be a list of callables"),
])
def test_sampling_params_that_would_fail_later_are_refused_up_front(kwargs, error, words):
    with pytest.raises(error, match=words):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"max_new_tokens": 0}, {"temperature": -1.0}, {"do_sample": True, "temperature": 0.0}, {"top_k": -1},
    {"top_p": 1.5}, {"seed": True}, {"num_return_sequences": 0}, {"stop_strings": ["x"]}, {"logits_processors": [1]},
    {"min_new_tokens": -1}, {"eos_token_id": "x"}, {"num_speculative_tokens": 16}, {"score_targets": []},
    {"logprobs": 21}, {"constraint_mode": "nope"}, {"max_retries": -1},
])
def test_every_refused_sampling_param_is_one_error_class(kwargs):
    """`except HfPagedError` (or InvalidConfigError) catches every refusal; `max_new_tokens=0` and others raised a
    plain ValueError where `logprobs=21` raised InvalidConfigError (h64). It stays a ValueError and a TypeError."""
    from hf_paged.errors import HfPagedError, InvalidConfigError

    with pytest.raises(InvalidConfigError) as caught:
        SamplingParams(**kwargs)
    assert isinstance(caught.value, HfPagedError | ValueError) and isinstance(caught.value, TypeError)


@pytest.mark.parametrize(("name", "value"), [("enable_prefix_caching", "no"), ("kv_huge_pages", 1),
                                             ("certified_argmax", "auto")])
def test_a_switch_that_is_not_a_bool_is_refused(name, value):
    """`enable_prefix_caching="no"` turned caching on (a non-empty string is true)."""
    with pytest.raises(ValueError, match=rf"PagedConfig.{name} must be (None \(auto\), )?True or False"):
        PagedConfig(**{name: value})


def test_arguments_of_the_wrong_kind_raise_and_claim_no_id(model):
    """A text prompt raised `ValueError: invalid literal for int()` after its id was claimed; a bad priority a bare
    `TypeError` from inside the scheduler; `pop_output` of an unknown id a bare `KeyError`."""
    engine = Engine(model, PagedConfig(block_size=4))
    with pytest.raises(TypeError, match=r"prompt_ids must be token ids .* tokenizer\(text\)"):
        engine.add_request("hello", request_id="mine")
    with pytest.raises(TypeError, match="priority must be an int"):
        engine.add_request([5, 6], priority="x", request_id="mine")
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        engine.add_request([5, 6], {"max_new_tokens": 2}, request_id="mine")
    assert engine.add_request(torch.tensor([5, 6]), SamplingParams(max_new_tokens=2), request_id="mine") == "mine"
    with pytest.raises(KeyError, match="no request 'nope' in this engine"):
        engine.pop_output("nope")


def test_a_prompt_past_one_step_without_chunked_prefill_names_the_fix(model):
    """It ended with "needs more blocks than the pool can ever free" on a nearly empty pool."""
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, enable_chunked_prefill=False,
                                       max_num_batched_tokens=16))
    long, short = engine.add_request(list(range(1, 40)), SamplingParams(max_new_tokens=4)), \
        engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=4))
    outputs = engine.run()
    error = outputs[long].error
    assert "max_num_batched_tokens=16" in error and "enable_chunked_prefill=True" in error
    assert outputs[short].error is None


def test_a_config_that_is_no_paged_config_is_a_type_error(model):
    """`Engine(model, {"block_size": 8})` raised a bare AttributeError ('dict' object has no attribute ...)."""
    with pytest.raises(TypeError, match=r"must be a PagedConfig, got dict; pass PagedConfig\(\*\*\{'block_size': 8\}\)"):
        Engine(model, {"block_size": 8})
