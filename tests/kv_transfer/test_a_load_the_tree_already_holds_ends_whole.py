"""Two requests with one prompt both read its blocks from the disk tier in the background; the first to be written
caches them all, and the other's load then finds every block in the tree: it ends whole (nothing to write), not as
a failed load, and both answers are the engine's alone."""

from __future__ import annotations

from hf_paged import SamplingParams
from hf_paged.kv_transfer import DirectoryStore
from tests.kv_transfer.test_paced_load import LONG_BLOCKS, decode_engine, handed_over, step_all
from tests.tiny_models import ragged_prompts, stock_greedy


def test_a_load_whose_blocks_the_tree_took_meanwhile_is_no_failure(model, tmp_path):
    prompt = ragged_prompts([LONG_BLOCKS * 8 + 3], seed=31)[0]
    store = handed_over(model, prompt, DirectoryStore(tmp_path, 2**22))
    engine = decode_engine(model, store)
    ids = [engine.add_request(prompt, SamplingParams(max_new_tokens=6)) for _ in range(2)]
    connector = engine.scheduler.kv_transfer
    assert connector.counters.prefetched_reads == 2  # both read on arrival
    assert step_all(engine, ids, []) == stock_greedy(model, [prompt], 6) * 2
    assert connector.counters.loaded_blocks == LONG_BLOCKS and connector.counters.load_failures == 0
