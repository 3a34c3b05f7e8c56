"""Paced loads (`paced_load.py`): a long prompt's handed-over blocks are written a chunk a step, each step within
its share of the prompt budget, while the other requests decode; the answer is the one engine's (fp32, greedy)."""

from __future__ import annotations

import threading

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.errors import InvalidConfigError
from hf_paged.kv_transfer import DirectoryStore, InProcessStore, TransferCostModel
from hf_paged.kv_transfer.cost_model import MarginalCost, Rate, StepTimes
from hf_paged.kv_transfer.paced_load import LoadStep
from tests.kv_transfer.test_engine_transfer import BS, run, transfer_stats
from tests.tiny_models import ragged_prompts, stock_greedy

LONG_BLOCKS = 20  # full blocks the store holds for the long prompt (its last token's block is computed)
TOKENS_PER_BLOCK = 2  # what the injected cost model says one block's write costs in prefill tokens
BUDGET = 8  # max_prefill_tokens_per_step of the decode engine: a step's share is 8 / 2 = 4 blocks


@pytest.fixture(scope="module")
def long_prompt():
    return ragged_prompts([LONG_BLOCKS * BS + 3], seed=31)[0]


@pytest.fixture(scope="module")
def short_prompts():
    return ragged_prompts([5, 9], seed=32)


@pytest.fixture(scope="module")
def expected(model, long_prompt, short_prompts):
    return stock_greedy(model, [long_prompt, *short_prompts], 6)


def handed_over(model, long_prompt, store=None):
    """A prefill engine computed the long prompt: its full blocks are in the store (an in-process one by default)."""
    store = store if store is not None else InProcessStore()
    run(Engine(model, PagedConfig(block_size=BS), kv_store=store), [long_prompt], max_new=1)
    return store


def decode_engine(model, store, **overrides) -> Engine:
    cfg = {"block_size": BS, "max_prefill_tokens_per_step": BUDGET, **overrides}
    engine = Engine(model, PagedConfig(**cfg), kv_store=store)
    connector = engine.scheduler.kv_transfer
    if store.nbytes:  # the largest blob's size (header included; headers differ by a few bytes) from the start: a
        connector._last_block_bytes = max(store._lru.sizes.values())  # loaded chunk's mean never costs more
    prefill = 1e3  # tokens/s; a block's write: TOKENS_PER_BLOCK tokens' time (frozen: the same every run)
    connector.cost = TransferCostModel(bandwidth_prior=connector.block_bytes() * prefill / TOKENS_PER_BLOCK,
                                       prefill_prior=prefill, learn=False)
    return engine


def step_all(engine, ids, loads: list[int], limit: int = 500, decoding: list[int] | None = None,
             after_step=None) -> list:
    """Step to the end (at most `limit` steps: no hang), checking integrity; `loads` gets each step's new blocks
    (`decoding`: how many requests were decoding when it started; `after_step()` runs after each)."""
    for _ in range(limit):
        if not engine.has_unfinished:
            break
        if decoding is not None:
            decoding.append(sum(r.num_tokens_to_compute == 1 for r in engine.scheduler.running))
        before = transfer_stats(engine)["loaded_blocks"]
        engine.step()
        engine.check_integrity()
        loads.append(transfer_stats(engine)["loaded_blocks"] - before)
        if after_step is not None:
            after_step()
    assert not engine.has_unfinished, "the engine did not finish"
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs), [o.error for o in outs]
    assert engine.cache.pool.num_used_blocks == 0
    return [o.generated_tokens for o in outs]


def start_decoding(engine, short_prompts) -> list[str]:
    """Short requests decoding before the long one arrives (a step's prompt budget is then bounded)."""
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in short_prompts]
    engine.step()
    return ids


def test_the_share_converts_the_prompt_budget_through_the_cost_model(model, long_prompt):
    engine = decode_engine(model, InProcessStore())
    paced = engine.scheduler.kv_transfer.paced
    assert paced.share(BUDGET, 100) == BUDGET // TOKENS_PER_BLOCK
    assert paced.share(1, 100) == 1  # less than a block's worth: one block, so a load always moves on
    assert paced.share(BUDGET, 3) == 3 and paced.share(None, 100) == 100


def test_a_step_never_writes_more_than_its_share_and_the_answer_is_one_engines(model, long_prompt, short_prompts,
                                                                               expected):
    engine = decode_engine(model, handed_over(model, long_prompt))
    ids = start_decoding(engine, short_prompts)
    ids.insert(0, engine.add_request(long_prompt, SamplingParams(max_new_tokens=6)))
    loads: list[int] = []
    assert step_all(engine, ids, loads) == [expected[0], *expected[1:]]
    share = BUDGET // TOKENS_PER_BLOCK
    assert max(loads) == share and sum(loads) == LONG_BLOCKS  # over 5 steps, never more than 4 blocks in one
    assert sum(1 for n in loads if n) == LONG_BLOCKS // share, loads
    stats = transfer_stats(engine)
    assert stats["load_failures"] == 0 and engine.stats()["prompt_tokens_cached"] >= LONG_BLOCKS * BS
    radix = engine.kv.prefix_cache  # its hit counters mean local hits: neither the chunks' lookups nor the loaded
    assert radix.num_hit_tokens == 0 and radix.num_hits == 0 and radix.num_queries == 3  # blocks are counted


def test_with_nothing_decoding_the_whole_budget_loads_at_once(model, long_prompt, expected):
    engine = decode_engine(model, handed_over(model, long_prompt))
    loads: list[int] = []
    ids = [engine.add_request(long_prompt, SamplingParams(max_new_tokens=6))]
    assert step_all(engine, ids, loads) == expected[:1]
    assert loads[0] == LONG_BLOCKS  # 1024 tokens of budget hold 512 blocks' worth


def test_a_blob_gone_midway_ends_the_load_and_the_rest_is_recomputed(model, long_prompt, short_prompts, expected):
    store = handed_over(model, long_prompt)
    engine = decode_engine(model, store)
    ids = start_decoding(engine, short_prompts)
    ids.insert(0, engine.add_request(long_prompt, SamplingParams(max_new_tokens=6)))
    while transfer_stats(engine)["loaded_blocks"] == 0:
        engine.step()
    assert transfer_stats(engine)["loaded_blocks"] == BUDGET // TOKENS_PER_BLOCK  # one chunk written
    keys = engine.scheduler.kv_transfer._keys(engine.kv.prefix_cache.digests(long_prompt[: LONG_BLOCKS * BS]))
    store.delete(keys[10])  # block 10's blob is gone before its chunk (blocks 8-11) is read
    assert step_all(engine, ids, []) == [expected[0], *expected[1:]]
    stats = transfer_stats(engine)
    assert stats["loaded_blocks"] == 8 + 2 and stats["load_failures"] == 1  # blocks 8, 9 of the third chunk


def test_a_failed_write_recomputes_and_counts_once(model, long_prompt, short_prompts, expected):
    engine = decode_engine(model, handed_over(model, long_prompt))
    connector = engine.scheduler.kv_transfer
    writes, write_blocks = [], connector.write_blocks

    def second_write_fails(block_ids, blocks):
        writes.append(len(blocks))
        return write_blocks(block_ids, blocks) if len(writes) != 2 else False

    connector.write_blocks = second_write_fails
    ids = start_decoding(engine, short_prompts)
    ids.insert(0, engine.add_request(long_prompt, SamplingParams(max_new_tokens=6)))
    assert step_all(engine, ids, []) == [expected[0], *expected[1:]]
    stats = transfer_stats(engine)
    assert writes == [4, 4] and stats["loaded_blocks"] == 4 and stats["load_failures"] == 1


def test_a_tight_pool_finishes_every_request(model, long_prompt, short_prompts, expected):
    """A pool barely larger than the long prompt: chunks written earlier may be evicted while the short requests
    grow (the load writes them again, or the request recomputes them); nothing waits forever."""
    engine = decode_engine(model, handed_over(model, long_prompt), num_blocks=LONG_BLOCKS + 4)
    ids = start_decoding(engine, short_prompts)
    ids.insert(0, engine.add_request(long_prompt, SamplingParams(max_new_tokens=6)))
    assert step_all(engine, ids, []) == [expected[0], *expected[1:]]


def test_load_step_answers_a_request_without_stored_blocks_at_once(model, short_prompts):
    engine = decode_engine(model, InProcessStore())
    step = engine.scheduler.kv_transfer.load_step("x", short_prompts[1] * 4, (), BUDGET)
    assert step == LoadStep(waiting=False, num_tokens=0)


def test_the_marginal_token_cost_is_the_slope_not_the_average():
    cost = MarginalCost()
    for n in (16, 16):
        cost.observe(n, 0.020 + 0.001 * n)  # 20 ms a step (the weights read once) + 1 ms a token
    assert cost.seconds_per_token is None  # one size: no slope
    cost.observe(20, 0.040)  # 16-20 tokens: too narrow a spread for a slope
    assert cost.seconds_per_token is None
    for n in (64, 23, 1024):
        cost.observe(n, 0.020 + 0.001 * n)
    assert cost.seconds_per_token == pytest.approx(0.001)
    model = TransferCostModel(bandwidth_prior=1e6, prefill_prior=100, learn=False)  # 10 ms a token assumed
    assert model.block_tokens(1000) == pytest.approx(0.1)  # a 1 ms write: a tenth of a token, until measured
    for n in (16, 64, 16, 64):
        model.observe_prefill(n, 0.020 + 0.001 * n)  # average now ~1.5 ms a token, marginal 1 ms
    assert model.block_tokens(1000) == pytest.approx(1.0, rel=0.05)


def test_blocks_read_in_the_background_are_written_a_share_a_step_too(model, long_prompt, short_prompts, expected,
                                                                       tmp_path):
    """A store that reads in a worker thread (a directory): the read comes first, then the same paced writes. The
    reads wait until the first step has ended (they may start at arrival: without the gate, a fast read raced it),
    and the next step waits for the read (a slow reader thread finished after the short requests: no step it wrote
    in had decodes beside it)."""
    store = handed_over(model, long_prompt, DirectoryStore(tmp_path, 1 << 30))
    gate = threading.Event()

    class GatedStore(DirectoryStore):
        def get(self, key):
            assert gate.wait(30), "the first step never ended"
            return super().get(key)

    engine = decode_engine(model, GatedStore(tmp_path, 1 << 30))
    assert engine.scheduler.kv_transfer.load_async
    ids = start_decoding(engine, short_prompts)
    ids.insert(0, engine.add_request(long_prompt, SamplingParams(max_new_tokens=6)))
    loads, decoding = [], []
    fetcher = engine.scheduler.kv_transfer.fetcher

    def read_after_the_first_step():
        gate.set()
        if ids[0] in fetcher:  # (once: the next step takes the read)
            fetcher.wait(30)
            assert fetcher.is_done(ids[0]), "the read never finished"

    assert step_all(engine, ids, loads, decoding=decoding, after_step=read_after_the_first_step) == [
        expected[0], *expected[1:]]
    assert max(n for n, d in zip(loads, decoding) if d) == BUDGET // TOKENS_PER_BLOCK and sum(loads) == LONG_BLOCKS
    assert loads[0] == 0  # the first step only started the read
    assert transfer_stats(engine)["load_failures"] == 0 and store.nbytes


def test_step_times_measure_a_token_against_a_decode_only_step_of_the_same_batch():
    steps = StepTimes()
    steps.observe(17, 16, 0.0335)  # a chunk beside a decode before any decode-only step: nothing to compare with
    assert steps.budget(1.5) is None and steps.token_seconds is None
    steps.observe(2048, 2048, 2.0)  # a prefill step (nothing decoding): not this model's business
    for n in (1, 7, 1, 7):
        steps.observe(n, 0, 0.015 + 0.0025 * n)  # decode-only steps: 17.5 ms with 1 decode, 32.5 ms with 7
    assert steps.decode_step(1) == pytest.approx(0.0175) and steps.decode_step(7) == pytest.approx(0.0325)
    for n in (1, 7):  # 16-token chunks add 4 ms (the chunk's own rows) + 0.75 ms a token = 16 ms
        steps.observe(n + 16, 16, 0.015 + 0.0025 * n + 0.016)
    assert steps.token_seconds == pytest.approx(0.001)  # one chunk size: the average, 1 ms a token
    for n in (1, 7):
        steps.observe(n + 4, 4, 0.015 + 0.0025 * n + 0.007)  # 4-token chunks: 4 + 3 ms
    assert steps.token_seconds == pytest.approx(0.00075)  # the line: small chunks no longer look dear
    assert steps.budget(1.5, 7) == 16 and steps.budget(1.5, 1) == 6  # ((1.5 - 1) x decode step - 4 ms) / 0.75 ms
    assert steps.budget(1.1, 1) == 1  # the fixed part alone is over the bound: a prompt still moves on
    model = TransferCostModel(bandwidth_prior=1e6, prefill_prior=100, learn=False)
    model.steps = steps
    assert model.block_tokens(750) == pytest.approx(1.0)  # a 0.75 ms write is one more token's cost
    assert model.prompt_budget(32, 1.5, 7) == 16 and model.prompt_budget(8, 1.5, 7) == 8  # the token bound caps
    assert model.prompt_budget(32, None, 7) == 32


def test_a_time_bounded_engine_keeps_every_step_within_its_ratio_of_a_decode_only_step(model, long_prompt,
                                                                                      short_prompts, expected):
    """Measured step times (injected: the same every run): a chunk token costs 1/4 of a decode-only step, so at
    ratio 1.5 a step carrying decodes takes 2 prompt tokens (local chunk and block writes together), not BUDGET."""
    engine = decode_engine(model, handed_over(model, long_prompt), max_prefill_step_time_ratio=1.5)
    connector = engine.scheduler.kv_transfer
    for _ in range(3):
        connector.cost.steps.observe(2, 0, 0.040)  # two decodes: 40 ms
    connector.cost.steps.observe(10, 8, 0.120)  # 8 tokens added 80 ms: 10 ms a token, a quarter of a decode step
    connector.cost.step_load = Rate(connector.block_bytes() * 50, 1.0, 1.0)  # a block's write on the step: 20 ms
    assert engine.scheduler._prompt_budget(2) == 2 and connector.paced.share(2, 100) == 1
    ids = start_decoding(engine, short_prompts)
    ids.insert(0, engine.add_request(long_prompt, SamplingParams(max_new_tokens=6)))
    loads, decoding = [], []
    assert step_all(engine, ids, loads, decoding=decoding) == [expected[0], *expected[1:]]
    assert max(n for n, d in zip(loads, decoding) if d) == 1 and sum(loads) == LONG_BLOCKS


def test_a_time_ratio_without_a_step_clock_is_a_typed_error(model):
    with pytest.raises(InvalidConfigError, match="kv_store= or kv_offload_dir"):
        Engine(model, PagedConfig(block_size=BS, max_prefill_tokens_per_step=8, max_prefill_step_time_ratio=1.4))


def test_a_load_may_overwrite_the_block_an_admission_copies_from_in_the_same_step(model):
    """A admitted first in a step takes a cached block it shares the start of (copy-on-write: the copy is queued for
    the forward, and A's reference to the source dropped, so it is evictable); B's load in the same step needs the
    pool's last blocks and evicts that source, then writes its own K/V into it. The queued copy must read the old
    contents (the connector applies pending copies before it writes), or A decodes from B's K/V."""
    x = ragged_prompts([2 * BS + 1], seed=41)[0]
    a = x[: 2 * BS - 2] + ragged_prompts([6], seed=42)[0]  # x's block 0, then 6 tokens of x's block 1 (shared partial)
    b = ragged_prompts([3 * BS + 1], seed=43)[0]  # 3 full blocks in the store, none here
    store = handed_over(model, b)
    engine = decode_engine(model, store, num_blocks=6, max_prefill_tokens_per_step=None)  # one step loads all 3
    run(engine, [x], max_new=1)  # x's 2 full blocks cached, idle
    pool = engine.cache.pool
    assert (pool.num_idle_cached_blocks, pool.num_free_blocks) == (2, 6)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in (a, b)]
    engine.step()  # A: block 0 hit, block 1 shared then copied (2 fresh blocks); B: 3 blocks, the last one evicted
    assert transfer_stats(engine)["loaded_blocks"] == 3 and pool.num_evictions == 1  # (x's block 1: A's copy source)
    assert step_all(engine, ids, []) == stock_greedy(model, [a, b], 6)
