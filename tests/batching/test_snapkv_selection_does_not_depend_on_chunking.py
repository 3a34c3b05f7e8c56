"""SnapKV / PyramidKV choose the same blocks however the prompt was chunked: the prompt's last 32 queries vote
whichever chunks run them (a query's scores see only the keys up to it), so a prompt whose last chunk holds one
token keeps what it keeps in one chunk, and its tokens are the same (they used to differ from the 2nd token on)."""

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.cache.engine_parity import engine_tokens
from tests.tiny_models import ragged_prompts, tiny_model


def run(model, prompts, policy, **config):
    tokens, engine = engine_tokens(model, prompts, max_new=16, block_size=4, kv_pruning=policy, kv_keep_ratio=0.5,
                                   num_sink_tokens=4, window_tokens=8, enable_prefix_caching=False, **config)
    assert not engine.pruner.pending  # nothing left behind
    return tokens, engine.stats()["kv_blocks_evicted"]


@pytest.mark.parametrize("policy", ["snapkv", "pyramidkv"])
def test_tokens_and_drops_are_the_same_for_every_chunking(policy):
    model = tiny_model("llama")
    prompts = ragged_prompts([40, 37, 45], seed=3)
    alone = [run(model, [p], policy, max_num_batched_tokens=256) for p in prompts]  # ([tokens], blocks dropped)
    for budget in (39, 16):  # 39: the 40-token prompt's last chunk is one token; 16: the window spans 2-3 chunks
        for prompt, want in zip(prompts, alone):
            assert run(model, [prompt], policy, max_num_batched_tokens=budget) == want, budget
    got, evicted = run(model, prompts, policy, max_num_batched_tokens=16)
    assert got == [t[0] for t, _ in alone] and evicted == sum(e for _, e in alone)


def test_a_request_aborted_inside_its_window_leaves_no_scores_behind():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=4, kv_pruning="snapkv", kv_keep_ratio=0.5, num_sink_tokens=4,
                                       window_tokens=8, enable_prefix_caching=False, max_num_batched_tokens=16))
    first, second = ragged_prompts([40, 37], seed=3)
    gone = engine.add_request(first, SamplingParams(max_new_tokens=4))
    engine.step()
    engine.step()  # positions 16..31: inside the 32-query window, scored and kept for the next chunk
    assert set(engine.pruner.pending) == {gone}
    engine.abort(gone)
    rid = engine.add_request(second, SamplingParams(max_new_tokens=4))
    engine.step()
    engine.step()  # the second prompt's chunk inside its window: the aborted request's scores are dropped
    assert set(engine.pruner.pending) == {rid}
    assert engine.run([rid])[rid].error is None and not engine.pruner.pending


def test_a_swapped_out_request_keeps_its_earlier_chunks_scores():
    """A request swapped out between two chunks of its window has no sequence in the manager until it is swapped
    back in; its scores so far must survive another request's chunk meanwhile (the window's earlier queries are not
    run again after a swap-in)."""
    import torch

    from hf_paged.batching.kv_pruning import KVPruner
    from hf_paged.batching.request import Request
    from hf_paged.cache.kv_manager import KVCacheManager

    class NoSequences(KVCacheManager):
        def __init__(self):
            self.seqs = {}  # every request is swapped out, as far as the pruner can see

    pruner = KVPruner(PagedConfig(block_size=4, kv_pruning="snapkv", kv_keep_ratio=0.5, num_sink_tokens=4,
                                  window_tokens=8), NoSequences(), num_layers=1)
    swapped, other = Request("swapped", list(range(40)), SamplingParams()), Request("b", list(range(40)), SamplingParams())
    swapped.num_computed_tokens = other.num_computed_tokens = 32
    assert pruner._observe(swapped, {0: torch.ones(2, 32)}) is None
    assert pruner._observe(other, {0: torch.ones(2, 32)}) is None
    assert set(pruner.pending) == {"swapped", "b"}
    swapped.num_computed_tokens = 40  # swapped back in: its last chunk ends the prompt
    merged = pruner._observe(swapped, {0: torch.zeros(2, 40)})
    assert merged is not None and merged[0][:, :32].eq(1).all() and merged[0][:, 32:].eq(0).all()
