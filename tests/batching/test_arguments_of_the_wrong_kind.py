"""Arguments of the wrong kind raise a `TypeError` naming the fix, the same one on every face of the engine, before
any id is claimed: `Engine.add_request`, `EngineLoop.submit` and `EngineLoop.generate_async` (h6 F4-F6, F8)."""

import asyncio
import logging

import pytest
import torch

from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def engine():
    engine = Engine(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=32))
    yield engine
    engine.loop.shutdown()


def _nothing_claimed(engine):
    assert not engine._reserved_ids and not engine.requests and engine.loop.num_in_flight == 0
    engine.check_integrity()


def test_a_prompt_tensor_of_several_rows_is_refused_and_one_row_taken(engine):
    """A [2, 3] tensor ran as ONE prompt of 6 tokens (reshape(-1)); [1, L] is one prompt, flattened."""
    with pytest.raises(TypeError, match=r"shape \[2, 3\] is not one prompt .* one request per row, or call "
                                        "generate_batch"):
        engine.add_request(torch.tensor([[5, 6, 7], [8, 9, 10]]), SamplingParams(max_new_tokens=2))
    _nothing_claimed(engine)
    rid = engine.add_request(torch.tensor([[5, 6, 7]]), SamplingParams(max_new_tokens=2))
    assert engine.run([rid])[rid].prompt_ids == [5, 6, 7]


def test_a_request_id_that_is_no_str_names_request_id(engine):
    """`request_id=5` raised "argument of type 'int' is not iterable"."""
    with pytest.raises(TypeError, match="request_id must be a str .* got int 5"):
        engine.add_request([5, 6], SamplingParams(max_new_tokens=2), request_id=5)
    with pytest.raises(TypeError, match="request_id must be a str"):  # the first id given back too
        engine.loop.submit([[5], [6]], [None, None], request_ids=["ok", 7])
    _nothing_claimed(engine)


@pytest.mark.parametrize(("prompt", "params", "words"), [
    ([5, 6], {"max_new_tokens": 3}, "params must be a SamplingParams, got dict"),
    ("hello", SamplingParams(max_new_tokens=3), r"prompt_ids must be token ids .* tokenizer\(text\)"),
    ([5, 6], SamplingParams(max_new_tokens=3), "priority must be an int"),
])
def test_the_loop_raises_what_add_request_raises(engine, prompt, params, words, caplog):
    """`submit` / `generate_async` with a dict of params raised AttributeError ('dict' object has no attribute
    'num_return_sequences'); with a text prompt the loop logged a traceback and the request ended FAILED."""
    priority = "high" if "priority" in words else 0
    with pytest.raises(TypeError, match=words):
        engine.add_request(prompt, params, priority=priority)
    with caplog.at_level(logging.ERROR, logger="hf_paged"), pytest.raises(TypeError, match=words):
        engine.loop.submit([[3, 4], prompt], [SamplingParams(max_new_tokens=2), params], priorities=[0, priority])

    async def stream():
        async for _ in engine.loop.generate_async(prompt, params, priority=priority):
            pass

    with caplog.at_level(logging.ERROR, logger="hf_paged"), pytest.raises(TypeError, match=words):
        asyncio.run(stream())
    assert not caplog.records
    _nothing_claimed(engine)


def test_the_loop_takes_none_for_the_default_params_as_add_request_does(engine):
    outs = engine.loop.submit([[5, 6], torch.tensor([[7, 8]])], [None, None]).result()
    assert [o.status for o in outs.values()] == [RequestStatus.FINISHED] * 2
    assert [o.prompt_ids for o in outs.values()] == [[5, 6], [7, 8]]

    async def stream():
        return [d.output async for d in engine.loop.generate_async([5, 6]) if d.finished]

    assert asyncio.run(stream())[0].status is RequestStatus.FINISHED
    _nothing_claimed(engine)


def test_run_and_stream_name_a_lone_id_and_an_unknown_one(engine):
    """`Engine.stream("req_0")` iterated the id's characters (KeyError: 'r'); an unknown id was a bare KeyError
    (h6 F13)."""
    rid = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=2))
    for method in (engine.run, lambda ids: list(engine.stream(ids))):
        with pytest.raises(TypeError, match=rf"takes a list of request ids, got the str '{rid}': pass \['{rid}'\]"):
            method(rid)
        with pytest.raises(KeyError, match="no request 'nope' in this engine"):
            method(["nope"])
    assert len(engine.run([rid])[rid].generated_tokens) == 2
    _nothing_claimed(engine)


def test_pin_prefix_takes_token_ids_only(engine):
    """Floats were truncated (94.5 -> 94) and pinned; a text raised int()'s bare ValueError (h7 F11)."""
    for bad in ([94.5, 3], "abc", [[1, 2]]):
        with pytest.raises(TypeError, match="must be token ids"):
            engine.pin_prefix(bad)
        with pytest.raises(TypeError, match="must be token ids"):
            engine.unpin_prefix(bad)
