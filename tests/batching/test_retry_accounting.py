"""A retried request's accounting (h77): its usage, stats() and /metrics count every attempt's tokens, and its
clock (arrival, first admission, first token) runs from its first attempt."""

from types import SimpleNamespace

from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig
from hf_paged.batching.request import RequestOutput, RequestStatus, RetryAttempt
from hf_paged.batching.retry import num_generated_tokens
from tests.batching.test_constrained_engine import SCHEMA, model_and_tokenizer
from tests.batching.test_retry import PROMPT, refuse_first, run, sampled


def test_a_retried_request_counts_every_attempt_and_keeps_its_first_admission():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    validator, _ = refuse_first(2)
    engine = Engine(model, PagedConfig(block_size=8))
    (out,) = run(engine, [tok(PROMPT)["input_ids"]], [sampled(tok, proc, max_retries=2, validator=validator)])
    assert len(out.attempts) == 3 and all(a.num_tokens for a in out.attempts)
    total = sum(a.num_tokens for a in out.attempts)
    assert total > len(out.generated_tokens)
    assert num_generated_tokens(out) == total == engine.stats()["generated_tokens"]
    # admitted (its first attempt) before its first token; the old retry reported its last attempt's admission
    first_token, finish = out.lifespan
    assert 0 <= out.created_time <= out.scheduled_time <= first_token <= finish
    # time per output token: the span from the first attempt's first token over every attempt's tokens (the old
    # figure divided that span by the last attempt's tokens alone, >= twice the span per token here)
    (tpot,) = engine.metrics.time_per_output_token
    assert tpot * (total - 1) <= finish - first_token


def test_the_servers_usage_and_tpot_count_every_attempt():
    from hf_paged.serving.generation import Usage, _last_event
    from hf_paged.serving.metrics import ServerMetrics

    attempts = [RetryAttempt("stop", [5] * 8, 0, 1, False), RetryAttempt("stop", [6] * 3, 36, 2, True)]
    output = RequestOutput("r", [1, 2], [6] * 3, RequestStatus.FINISHED, finish_reason="stop", num_cached_tokens=36,
                           created_time=0.0, scheduled_time=1.0, lifespan=(2.0, 12.0), attempts=attempts)
    usage, metrics = Usage(), ServerMetrics(loop=None, model_name="m")
    observed: list[float] = []
    metrics.tpot = SimpleNamespace(observe=observed.append)
    _last_event(0, "", SimpleNamespace(output=output, new_token_ids=[]), SimpleNamespace(stopped=False), usage,
                metrics, 1.0)
    assert usage.completion_tokens == 11  # 8 + 3, as generation_tokens_total counted them
    assert usage.cached_tokens == 0  # the prompt, billed once, was computed by the first attempt (not 36 cached)
    assert observed == [10.0 / 10]  # (12 - 2) s over 11 tokens' 10 gaps
