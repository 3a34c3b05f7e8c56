"""One engine parity check for compressed-cache settings: batched, chunked, preempted and prefix-shared runs give
the tokens of each request run alone with the same setting (the master test, per setting)."""

from __future__ import annotations

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model


def engine_tokens(model, prompts, max_new: int = 12, **config) -> tuple[list[list[int]], Engine]:
    """Greedy tokens of `prompts` (`max_new` new each) through an `Engine(model, PagedConfig(**config))`, its
    integrity checked after every step."""
    engine = Engine(model, PagedConfig(**config))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new)) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs)
    return [o.generated_tokens for o in outs], engine


def check_engine_parity(setting: dict, streaming: dict | None = None) -> None:
    """`setting` (PagedConfig fields, block size included) batched with chunked prefill, under preemption (swap;
    recompute with streaming heads, which allow only that) and with prefix hits (not with streaming heads, which
    turn prefix caching off) gives each request's tokens run alone."""
    model = tiny_model("llama")
    shared = ragged_prompts([24], seed=9)[0]
    prompts = [*ragged_prompts([5, 33, 19], seed=3), shared + [7, 8, 9], shared + [10, 11]]
    base = {**setting, **streaming, "enable_prefix_caching": False} if streaming else dict(setting)

    def run(batch, **overrides):
        return engine_tokens(model, batch, **{**base, **overrides})

    alone = [run([p], max_num_batched_tokens=256)[0][0] for p in prompts]
    assert run(prompts, max_num_batched_tokens=16)[0] == alone
    got, engine = run(prompts, num_blocks=12, max_num_batched_tokens=32, enable_prefix_caching=False,
                      preemption_mode="recompute" if streaming else "swap")
    assert engine.stats()["preemptions"] > 0 and got == alone
    if not streaming:
        got, engine = run(prompts, max_num_batched_tokens=256, max_num_seqs=1)
        assert got == alone and engine.stats()["prompt_tokens_cached"] >= 24
