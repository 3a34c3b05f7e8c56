"""Reproducibility of seeded requests: the tokens of `SamplingParams(seed=...)` depend on the prompt, the parameters
and the seed only, not on the schedule, the batch around them, the cache, speculation or the constraint mode
(README "Known limitations": sampling and seeds; `batching/seeded_draws.py`)."""

from __future__ import annotations

import pytest
import torch

from hf_paged import Engine, PagedConfig, RegexLogitsProcessor, SamplingParams
from hf_paged.batching.request import Request, fork_ids
from hf_paged.batching.sampler import Sampler
from hf_paged.batching.seeded_draws import draw, noise_seed
from hf_paged.processors.index.index_cache import IndexCache
from tests.tiny_models import byte_tokenizer, ragged_prompts, tiny_model

PROMPTS = ragged_prompts([7, 20, 33, 5, 41], seed=3)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _run(model, requests, preemptions: list | None = None, **config) -> list:
    """The requests' outputs, run to the end with integrity checks; `preemptions` gets the engine's count."""
    engine = Engine(model, PagedConfig(**{"num_blocks": 128, "block_size": 16, **config}))
    ids = [engine.add_request(p, sp) for p, sp in requests]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs), [o.error for o in outs]
    if preemptions is not None:
        preemptions.append(engine.stats()["preemptions"])
    return outs


def _seeded(**kw) -> SamplingParams:
    return SamplingParams(**{"max_new_tokens": 16, "do_sample": True, "temperature": 0.8, "seed": 1234, **kw})


def _company(n: int) -> list:
    """Other requests: greedy, unseeded sampled, seeded, of other lengths."""
    kinds = [SamplingParams(max_new_tokens=5), SamplingParams(max_new_tokens=23, do_sample=True),
             SamplingParams(max_new_tokens=9, do_sample=True, seed=7, top_k=20)]
    return [(PROMPTS[(i + 1) % len(PROMPTS)], kinds[i % 3]) for i in range(n)]


@pytest.mark.parametrize("config", [
    {}, {"block_size": 1, "num_blocks": 1024}, {"block_size": 64, "num_blocks": 32},
    {"enable_chunked_prefill": True, "max_num_batched_tokens": 8},
    {"num_blocks": 16, "block_size": 4, "preemption_mode": "recompute"},
    {"num_blocks": 16, "block_size": 4, "preemption_mode": "swap"},
    {"max_num_seqs": 2},
], ids=["default", "block1", "block64", "chunk8", "recompute", "swap", "two_seqs"])
def test_a_seeded_request_gives_its_tokens_alone_or_anywhere_in_any_batch(model, config):
    target = (PROMPTS[0], _seeded())
    alone = _run(model, [target])[0].generated_tokens
    preemptions: list[int] = []
    for size, position in ((2, 0), (2, 1), (6, 3), (6, 5)):
        others = _company(size - 1)
        outs = _run(model, others[:position] + [target] + others[position:], preemptions, **config)
        assert outs[position].generated_tokens == alone, (size, position)
    if "preemption_mode" in config:
        assert sum(preemptions) > 0  # the tiny pool did preempt


def test_a_seeded_request_repeats_on_a_warm_prefix_cache(model):
    target = (PROMPTS[4], _seeded())
    cold = _run(model, [target])[0]
    engine_outs = _run(model, [(PROMPTS[4][:32] + [5, 6], SamplingParams(max_new_tokens=3)), target, target])
    assert engine_outs[2].num_cached_tokens > 0
    assert engine_outs[1].generated_tokens == engine_outs[2].generated_tokens == cold.generated_tokens


def test_forks_are_distinct_reproducible_and_do_not_depend_on_n(model):
    def forks(n):
        engine = Engine(model, PagedConfig(num_blocks=128, block_size=16))
        rid = engine.add_request(PROMPTS[1], _seeded(num_return_sequences=n))
        outs = engine.run()
        return [outs[i].generated_tokens for i in fork_ids(rid, n)]

    four = forks(4)
    assert forks(4) == four and len({tuple(t) for t in four}) == 4
    assert forks(2) == four[:2] and forks(6)[:4] == four
    assert forks(1) == four[:1] == [_run(model, [(PROMPTS[1], _seeded())])[0].generated_tokens]


# -- speculative decoding: a seeded request's tokens are those of decoding one token at a time ------------------
def test_seeded_speculation_gives_the_tokens_of_plain_decoding(model):
    """Fails with the draws of one generator stream advanced per draw: the stream then depends on how many drafts
    each step verified (and on the draft model's own draws), and the tokens differ from plain decoding."""
    repetitive = (PROMPTS[3] * 6)[:30]  # prompt lookup finds n-grams to draft
    plain = _run(model, [(repetitive, _seeded(max_new_tokens=24, temperature=0.3))])[0].generated_tokens
    same_weights, other_weights = tiny_model("llama"), tiny_model("llama", seed=7)
    for k in (1, 4):
        for draft_model in (None, same_weights, other_weights):
            spec = _seeded(max_new_tokens=24, temperature=0.3, num_speculative_tokens=k, draft_model=draft_model,
                           prompt_lookup_max_ngram=2)
            out = _run(model, [(repetitive, spec)])[0]
            assert out.num_draft_tokens > 0
            assert out.generated_tokens == plain, (k, draft_model is not None)
            if draft_model is same_weights:  # the coupled race: a draft model equal to the model guesses every token
                assert out.num_accepted_tokens == out.num_draft_tokens
            # in a batch, under a budget that cuts the drafts a step verifies
            outs = _run(model, _company(3) + [(repetitive, spec)], enable_chunked_prefill=True,
                        max_num_batched_tokens=12)
            assert outs[-1].generated_tokens == plain


def _verify_once(seed: int, drafts: list[int], q: torch.Tensor | None, logits: torch.Tensor) -> list[int]:
    from hf_paged.batching.speculative.verification import DraftRows, verify

    request = Request(f"r{seed}", [1, 2, 3], SamplingParams(do_sample=True, num_speculative_tokens=2, seed=seed))
    request.draft_ids, request.draft_probs = drafts, q
    (verdict,) = verify(DraftRows([request], logits.clone(), [0], [len(drafts)]), Sampler())
    return verdict.token_ids


def test_seeded_verification_keeps_exactly_the_drafts_plain_decoding_would_draw():
    logits = torch.tensor([[1.0, 0.2, 2.0, -1.0, 0.5], [0.0, 1.5, -0.5, 0.3, 1.0], [2.0, 0.0, 0.0, 1.0, -2.0]])
    probs = torch.softmax(logits, dim=-1)
    first = torch.zeros(5)
    for seed in range(3000):
        request = Request("x", [1], SamplingParams(do_sample=True, seed=seed))
        plain = [draw(request, probs[j], j) for j in range(3)]
        tokens = _verify_once(seed, [2, 4], None, logits)
        assert tokens == plain[: len(tokens)]  # kept drafts, then the model's own token: plain decoding's
        assert tokens[:-1] == [2, 4][: len(tokens) - 1]
        first[tokens[0]] += 1
    # the race draws from the model's distribution (chi-square, 4 degrees of freedom, p = 0.001: 18.47)
    expected = 3000 * probs[0]
    assert float(((first - expected) ** 2 / expected).sum()) < 18.47


# -- constraints: resample mode picks mask mode's tokens ---------------------------------------------------------
def test_seeded_resample_mode_gives_mask_modes_tokens():
    """Fails with a stream advanced per draw: a refusal costs resample mode a second draw, so its later tokens (and
    here its first) differ from mask mode's."""
    tok = byte_tokenizer()
    proc = RegexLogitsProcessor(r"[a-h]x+", tok, index_cache=IndexCache())
    logits = torch.randn(1, len(tok), generator=torch.Generator(device="cpu").manual_seed(0))
    logits[0, tok.convert_tokens_to_ids(list("abcdefgh"))] += 2.0
    logits[0, tok.convert_tokens_to_ids("q")] += 6.0  # the unconstrained favourite is refused
    sampler = Sampler()
    for seed in range(200):
        picks = []
        for mode in ("mask", "resample"):
            params = SamplingParams(do_sample=True, temperature=0.8, seed=seed, logits_processors=[proc],
                                    constraint_mode=mode)
            picks.append(sampler([Request(f"{mode}{seed}", [0], params)], logits.clone()).token_ids[0])
        assert picks[0] == picks[1], seed
    assert sampler.constraint_stats.num_rejections > 0


def test_noise_seeds_are_digests_of_seed_and_position():
    assert noise_seed(1, 1) != noise_seed(2, 0) and noise_seed(1, 0) != noise_seed(0, 1)
    assert 0 <= noise_seed(-(2**63), 10**9) < 2**63


# -- unseeded rows: torch's global generator, stock's row order ----------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"num_return_sequences": 2}, {"repetition_penalty": 1.3}],
                         ids=["warpers", "forks", "processor"])
def test_unseeded_generate_repeats_under_manual_seed_with_a_warm_prefix_cache(options):
    """Fails when the draws follow the schedule's order: the second call finds the prompts cached, the longest cached
    prompts are admitted first, and the same `torch.manual_seed` gave other tokens than the first call (and stock)."""
    import hf_paged
    from tests.tiny_models import left_pad

    stock, wrapped = tiny_model("llama"), hf_paged.wrap(tiny_model("llama"))
    ids, mask = left_pad(ragged_prompts([7, 20, 33, 5], seed=3), 0)

    def sampled(model):
        torch.manual_seed(0)
        out = model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=10, top_k=50, **options)
        return out[:, ids.shape[1]:].tolist()

    reference = sampled(stock)
    assert sampled(wrapped) == reference  # cold cache
    assert sampled(wrapped) == reference  # the same prompts cached: admitted longest first


class _StopAfter:
    """A caller's criterion: a row is done once its last token is `token` (replayed between steps; the engine aborts
    the row)."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


@pytest.mark.parametrize("how", ["eos", "eos_forks", "criterion"])
def test_unseeded_generate_matches_stock_after_a_row_ends(how):
    """Stock keeps a row that ended in its batch and draws for it until the call ends (its token replaced by padding);
    the engine's ended row drew nothing, so every later row drew from a shifted stream: a sampled call matched stock
    only until its first row ended (batching/stock_batch.py)."""
    from transformers import StoppingCriteriaList

    import hf_paged
    from tests.tiny_models import left_pad

    stock, wrapped = tiny_model("llama"), hf_paged.wrap(tiny_model("llama"))
    ids, mask = left_pad(ragged_prompts([7, 20, 33, 5], seed=3), 0)
    forks = {"num_return_sequences": 2} if how == "eos_forks" else {}

    def sampled(model, stop=None, eos=None):
        torch.manual_seed(0)
        # a criterion's row is padded and aborted only beside an EOS criterion (stock pads finished rows only then)
        kw = {"eos_token_id": stop} if how != "criterion" or stop is None else {
            "stopping_criteria": StoppingCriteriaList([_StopAfter(stop)]), "eos_token_id": eos}
        out = model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=10, top_k=50, pad_token_id=0,
                             **forks, **kw)
        return out[:, ids.shape[1]:].tolist()

    free = sampled(stock)
    stop = free[1][2]  # the second row's third token: that row ends there, the others go on
    eos = next(t for t in range(1, 250) if all(t not in row for row in free))  # an EOS criterion that never fires
    reference = sampled(stock, stop, eos)
    assert all(eos not in row for row in reference)
    ends = [row.index(stop) if stop in row else None for row in reference]
    assert ends[1] == 2 and None in ends  # one row ends early, another runs to the end
    assert sampled(wrapped, stop, eos) == reference  # cold cache
    assert sampled(wrapped, stop, eos) == reference  # warm


_FRESH_PROCESS = """
import json, torch
from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model
engine = Engine(tiny_model("llama"), PagedConfig(num_blocks=64, block_size=16))
prompts = ragged_prompts([7, 20], seed=3)
ids = [engine.add_request(p, SamplingParams(max_new_tokens=12, do_sample=True, seed=5, num_return_sequences=2,
                                            num_speculative_tokens=2)) for p in prompts]
torch.manual_seed(0)
ids.append(engine.add_request(prompts[0], SamplingParams(max_new_tokens=12, do_sample=True)))
outs = engine.run()
RESULT = json.dumps(sorted([rid, out.generated_tokens] for rid, out in outs.items()))
"""


def test_the_same_seeds_give_the_same_text_in_a_fresh_process():
    """A restart (another PYTHONHASHSEED, a new process's generators) repeats seeded and manual_seed'ed text."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS + "print(RESULT)"],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    fresh = json.loads(done.stdout.strip().splitlines()[-1])
    here: dict = {}
    exec(_FRESH_PROCESS, here)  # noqa: S102 -- the same script in this process
    runs = [fresh, json.loads(here["RESULT"])]
    assert runs[0] == runs[1]
    assert len(runs[0]) == 5 and all(len(tokens) == 12 for _, tokens in runs[0])


def test_unseeded_rows_sharing_an_uncached_prefix_match_stock_once_it_is_cached():
    """README: the first call whose rows share a prefix not cached yet draws otherwise than stock (the later rows
    wait a step for the first one's blocks); the calls after it, the prefix cached, give stock's tokens."""
    import hf_paged
    from tests.tiny_models import left_pad

    stock, wrapped = tiny_model("llama"), hf_paged.wrap(tiny_model("llama"))
    shared = ragged_prompts([24], seed=9)[0]
    ids, mask = left_pad([shared + p for p in ragged_prompts([7, 20, 5], seed=3)], 0)

    def sampled(model):
        torch.manual_seed(0)
        out = model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=10, top_k=50)
        return out[:, ids.shape[1]:].tolist()

    reference = sampled(stock)
    sampled(wrapped)  # cold: the first row computes the shared blocks, the others wait a step
    assert sampled(wrapped) == reference
    assert sampled(wrapped) == reference


def test_int8_kv_cache_seeded_text_repeats_under_one_config(model):
    """README: kv_cache_dtype="int8" changes the logits (with block_size), and repeats under one config."""
    target = (PROMPTS[4], _seeded())
    alone = _run(model, [target], kv_cache_dtype="int8")[0].generated_tokens
    for config in ({}, {"enable_chunked_prefill": True, "max_num_batched_tokens": 8},
                   {"num_blocks": 16, "block_size": 4, "preemption_mode": "recompute"}):
        size = {"block_size": 16, **config}["block_size"]
        target_alone = alone if size == 16 else _run(model, [target], kv_cache_dtype="int8",
                                                     **config)[0].generated_tokens
        outs = _run(model, _company(3) + [target], kv_cache_dtype="int8", **config)
        assert outs[-1].generated_tokens == target_alone


def test_rows_out_of_arrival_order_keep_their_own_constraint_masks():
    """The draws go in arrival order, the constraint masks in row order: rows scheduled 0, 2, 1, 3 by arrival (a warm
    prefix cache admits the longest cached first) each get their own state's mask. Failed with the arrival order
    passed to the batched masking too: a contiguous run masked as one slice took the masks in the other order."""
    tok = byte_tokenizer()
    proc = RegexLogitsProcessor(r"[a-h]x+", tok, index_cache=IndexCache())
    x, a = tok.convert_tokens_to_ids("x"), tok.convert_tokens_to_ids("a")
    requests = []
    for arrival, history in zip((0, 2, 1, 3), ([], [a], [], [a])):
        request = Request(f"r{arrival}", [0], SamplingParams(logits_processors=[proc]), arrival_index=arrival)
        request.output_ids = list(history)
        requests.append(request)
    logits = torch.zeros(4, len(tok))
    logits[:, a] = 5.0  # the start state's favourite; after "a" only "x" is allowed
    out = Sampler()(requests, logits)
    assert out.token_ids == [a, x, a, x]
