"""A request aborted while its blocks are written a chunk a step takes its paced load with it: the engine stops
waiting on it, and a later request under the same id (ids may be reused once collected) with another prompt never
gets the blocks read for the first one."""

from __future__ import annotations

from hf_paged import SamplingParams
from tests.kv_transfer.test_engine_transfer import BS
from tests.kv_transfer.test_paced_load import LONG_BLOCKS, decode_engine, handed_over, start_decoding, step_all
from tests.tiny_models import ragged_prompts, stock_greedy


def test_an_aborted_paced_load_is_dropped_and_its_id_starts_afresh(model):
    long_prompt, other = ragged_prompts([LONG_BLOCKS * BS + 3] * 2, seed=31)  # the paced-load tests' long prompt first
    short_prompts = ragged_prompts([5, 9], seed=32)
    engine = decode_engine(model, handed_over(model, long_prompt))
    start_decoding(engine, short_prompts)
    rid = engine.add_request(long_prompt, SamplingParams(max_new_tokens=6), request_id="long")
    engine.step()  # its first chunk of 4 blocks (of 20) is written
    connector = engine.scheduler.kv_transfer
    assert rid in connector.paced and connector.counters.loaded_blocks == 4
    engine.abort(rid)
    engine.pop_output(rid)
    assert len(connector.paced) == 0 and not engine.scheduler.is_loading
    again = engine.add_request(other, SamplingParams(max_new_tokens=6), request_id="long")  # another prompt
    assert step_all(engine, [again], []) == stock_greedy(model, [other], 6)
    assert connector.counters.loaded_blocks == 4  # the store holds nothing of the new prompt
