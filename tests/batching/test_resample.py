"""constraint_mode="resample": same distribution as mask mode, same greedy tokens, fewer masks, typed refusals."""

import pytest
import torch

from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, RegexLogitsProcessor, SamplingParams, default_model
from hf_paged.batching.request import Request
from hf_paged.batching.sampler import Sampler
from hf_paged.errors import InvalidConfigError
from hf_paged.processors.index.index_cache import IndexCache
from tests.batching.test_constrained_engine import SCHEMA, model_and_tokenizer
from tests.tiny_models import byte_tokenizer

ALLOWED = b"abcdefgh"  # the first byte of a match of `[a-h]x+`: 8 tokens of the byte vocabulary
CHI2_7DOF_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001


def _draws(mode: str, logits: torch.Tensor, proc, num: int, seed: int, temperature: float = 1.0) -> list[int]:
    """The first tokens drawn by the engine's sampler at the constraint's start for `num` requests seeded `seed`,
    `seed + 1`, ... (a seeded request's draw at one position is a function of its seed: seeded_draws.py)."""
    sampler = Sampler()
    params = SamplingParams(do_sample=True, temperature=temperature, seed=seed, logits_processors=[proc],
                            constraint_mode=mode)
    tokens = []
    for i in range(num):
        request = Request("r", [0], params.replace(seed=seed + i))
        out = sampler([request], logits.clone())
        assert out.errors == [None]
        tokens.append(out.token_ids[0])
    return tokens, sampler.constraint_stats


def test_resample_draws_follow_the_masked_distribution():
    tok = byte_tokenizer()
    proc = RegexLogitsProcessor(r"[a-h]x+", tok, index_cache=IndexCache())
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, len(tok), generator=g)
    allowed = [tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(tok(chr(b))["input_ids"])[0]) for b in ALLOWED]
    logits[0, allowed] += 2.0  # about half the unconstrained mass is allowed: both paths of resample run
    logits[0, ord("q")] += 6.0  # and the argmax is refused
    temperature = 0.8
    target = torch.softmax(logits[0, allowed].double() / temperature, dim=-1)
    num = 6000
    p_allowed = torch.softmax(logits[0] / temperature, dim=-1)[allowed].sum().item()
    assert 0.2 < p_allowed < 0.8
    for mode in ("mask", "resample"):
        tokens, stats = _draws(mode, logits, proc, num, seed=1234, temperature=temperature)
        assert set(tokens) <= set(allowed)
        counts = torch.tensor([tokens.count(t) for t in allowed], dtype=torch.float64)
        chi2 = ((counts - num * target) ** 2 / (num * target)).sum().item()
        assert chi2 < CHI2_7DOF_P001, (mode, chi2)
        tv = 0.5 * (counts / num - target).abs().sum().item()
        assert tv < 0.03, (mode, tv)
        assert stats.num_constrained_tokens == num
        if mode == "mask":
            assert stats.num_masks_computed == num and stats.num_rejections == 0
        else:  # a mask only for the refused draws: about (1 - p(A)) of them
            assert stats.num_rejections == stats.num_masks_computed
            assert abs(stats.num_rejections / num - (1 - p_allowed)) < 0.03


def test_resample_is_reproducible_with_a_seed():
    tok = byte_tokenizer()
    proc = RegexLogitsProcessor(r"[a-h]x+", tok, index_cache=IndexCache())
    logits = torch.randn(1, len(tok), generator=torch.Generator().manual_seed(3))
    a, _ = _draws("resample", logits, proc, 50, seed=7)
    b, _ = _draws("resample", logits, proc, 50, seed=7)
    assert a == b


def _engine_outputs(model, tok, proc, prompts, mode: str, max_new_tokens: int = 60, **kwargs):
    engine = Engine(model, PagedConfig(block_size=8))
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id, logits_processors=[proc],
                            constraint_mode=mode, **kwargs)
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    outs = {rid: engine.pop_output(rid) for rid in ids}
    return [outs[rid] for rid in ids], engine.stats()


@pytest.mark.parametrize("kind", ["json", "regex"])
def test_greedy_tokens_identical_between_modes(kind):
    model, tok = model_and_tokenizer()
    if kind == "json":
        proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    else:
        proc = RegexLogitsProcessor(r"(cat|dog)s? [0-9]{1,3}( and (cat|dog)s? [0-9]{1,3})*\.", tok)
    prompts = [tok(p)["input_ids"] for p in ("Pets: ", "Tell me about 3 cats as JSON:", "{")]
    masked, mask_stats = _engine_outputs(model, tok, proc, prompts, "mask")
    resampled, resample_stats = _engine_outputs(model, tok, proc, prompts, "resample")
    assert [o.generated_tokens for o in resampled] == [o.generated_tokens for o in masked]
    assert [o.finish_reason for o in resampled] == [o.finish_reason for o in masked]
    assert mask_stats["masks_computed"] == mask_stats["constrained_tokens"] > 0
    assert resample_stats["constrained_tokens"] == mask_stats["constrained_tokens"]
    assert resample_stats["masks_computed"] == resample_stats["resample_rejections"]
    assert sum(o.num_masks_computed for o in resampled) == resample_stats["masks_computed"]


def test_resample_computes_no_mask_when_the_model_complies():
    # the embedded trained model writes printable ASCII after this prompt: nothing to refuse, no mask to compute
    model, tok = default_model()
    proc = RegexLogitsProcessor(r"[ -~]{0,40}", tok)
    prompts = [tok("import os\nimport ")["input_ids"]]
    masked, _ = _engine_outputs(model, tok, proc, prompts, "mask", max_new_tokens=30)
    resampled, stats = _engine_outputs(model, tok, proc, prompts, "resample", max_new_tokens=30)
    assert resampled[0].generated_tokens == masked[0].generated_tokens
    assert stats["masks_computed"] == stats["resample_rejections"] == 0 < stats["constrained_tokens"]


def test_allows_agrees_with_the_mask_on_both_paths(monkeypatch):
    tok = byte_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok, index_cache=IndexCache())
    compiled = proc.compiled
    document = list(tok('{"count": 12, "kind": "dog"}')["input_ids"]) + [tok.eos_token_id]
    for n in range(len(document)):
        history = document[:n]
        state = proc._request_state("r", history)
        mask = proc._row_mask(state, compiled)
        bits = [(int(mask.words[t >> 5]) >> (t & 31)) & 1 == 1 for t in range(len(tok))]
        assert [proc.allows("r", history, t) for t in range(len(tok))] == bits  # the memoised mask's bits
        with monkeypatch.context() as m:  # never visited: the walk of the token's bytes
            m.setattr(type(compiled), "state_mask", lambda self, s: None)
            assert [proc.allows("r", history, t) for t in range(len(tok))] == bits
    assert not proc.allows("r", document, ord("{"))  # after EOS: only EOS
    assert proc.allows("r", document, tok.eos_token_id)
    assert not proc.allows("r", [], 10_000)  # beyond the tokenizer's vocabulary (padded logits)


def test_output_scores_and_truncating_warpers_fall_back_to_mask():
    from transformers.generation.logits_process import TopKLogitsWarper

    from hf_paged.batching.constraint_modes import resample_checks

    tok = byte_tokenizer()
    proc = RegexLogitsProcessor(r"[a-h]x+", tok)
    base = SamplingParams(do_sample=True, logits_processors=[proc], constraint_mode="resample")
    assert resample_checks(Request("a", [0], base)) == [proc]
    assert not resample_checks(Request("b", [0], base.replace(output_scores=True)))
    assert not resample_checks(Request("c", [0], base.replace(logits_processors=[proc, TopKLogitsWarper(5)])))
    greedy = base.replace(do_sample=False, logits_processors=[proc, TopKLogitsWarper(5)])
    assert resample_checks(Request("d", [0], greedy))  # top-k keeps the argmax: greedy is exact either way
    assert not resample_checks(Request("e", [0], base.replace(constraint_mode="mask")))
    assert not resample_checks(Request("f", [0], base.replace(logits_processors=[])))


@pytest.mark.parametrize("kwargs, words", [
    ({"constraint_mode": "sample"}, "constraint_mode"),
    ({"constraint_mode": "resample", "do_sample": True, "top_k": 5}, "top_k"),
    ({"constraint_mode": "resample", "do_sample": True, "top_p": 0.9}, "top_p"),
    ({"constraint_mode": "resample", "num_speculative_tokens": 3}, "speculative"),
])
def test_resample_refuses_what_would_change_the_distribution(kwargs, words):
    with pytest.raises(InvalidConfigError, match=words):
        SamplingParams(**kwargs)
    SamplingParams(constraint_mode="resample", do_sample=False, top_k=5)  # greedy ignores the warpers
