"""Sampled speculative decoding keeps the model's distribution (rejection sampling, Leviathan et al. 2023): checked
exactly on hand-made logits, then end to end against distributions enumerated from a tiny-vocabulary model."""

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.request import Request
from hf_paged.batching.sampler import Sampler
from hf_paged.batching.speculative import DraftRows, verify

P_VALUE = 1e-3  # seeds are fixed, so each test is deterministic; this only says how close is close enough


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of `counts` to `probs` (cells expected below 5 are pooled into one)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum(0, keepdim=True)])
        expected = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    stat = float(((counts - expected) ** 2 / expected.clamp_min(1e-12)).sum())
    dof = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# -- verification alone ------------------------------------------------------------------------------------
LOGITS = torch.tensor([[1.0, 0.2, 2.0, -1.0, 0.5],   # the model after the last token
                       [0.0, 1.5, -0.5, 0.3, 1.0],   # after the first draft
                       [2.0, 0.0, 0.0, 1.0, -2.0]])  # after the second (the bonus token's distribution)
Q = torch.tensor([[0.1, 0.1, 0.2, 0.5, 0.1],          # the draft model's distributions (draft_model case)
                  [0.6, 0.1, 0.1, 0.1, 0.1]])


@pytest.mark.parametrize("drafter", ["point_mass", "draft_distribution"])
def test_verification_emits_the_model_distribution(drafter):
    p = torch.softmax(LOGITS, dim=-1)
    sampler = Sampler()
    first = torch.zeros(5)
    second_given_kept = torch.zeros(5)
    bonus = torch.zeros(5)
    draws = torch.Generator().manual_seed(0)
    for seed in range(6000):
        request = Request(f"r{seed}", [1, 2, 3], SamplingParams(do_sample=True, num_speculative_tokens=2))
        request.generator = torch.Generator().manual_seed(seed)
        if drafter == "point_mass":
            request.draft_ids = [2, 4]  # prompt lookup: a fixed proposal
        else:
            request.draft_ids = [int(torch.multinomial(q, 1, generator=draws)) for q in Q]
            request.draft_probs = Q
        (verdict,) = verify(DraftRows([request], LOGITS.clone(), [0], [2]), sampler)
        tokens = verdict.token_ids
        assert len(tokens) == verdict.num_accepted + 1 and tokens[: verdict.num_accepted] == request.draft_ids[
            : verdict.num_accepted]
        first[tokens[0]] += 1
        if verdict.num_accepted >= 1:
            second_given_kept[tokens[1]] += 1
        if verdict.num_accepted == 2:
            bonus[tokens[2]] += 1
    assert chi_square_p_value(first, p[0]) > P_VALUE
    assert chi_square_p_value(second_given_kept, p[1]) > P_VALUE
    assert chi_square_p_value(bonus, p[2]) > P_VALUE
    assert bonus.sum() > 200  # enough accepted twice for the check to mean something


def test_greedy_verification_keeps_the_argmax_prefix():
    sampler = Sampler()
    request = Request("r", [1], SamplingParams(num_speculative_tokens=2))
    request.draft_ids = [2, 3]  # argmax after the last token is 2 (kept), after it 1 (so 3 is rejected)
    (verdict,) = verify(DraftRows([request], LOGITS.clone(), [0], [2]), sampler)
    assert (verdict.token_ids, verdict.num_drafted, verdict.num_accepted) == ([2, 1], 2, 1)


# -- end to end ------------------------------------------------------------------------------------------
VOCAB = 6
TEMPERATURE = 0.7
PROMPT = [1, 2, 3, 1, 2, 4, 5, 1, 2]  # "1 2" recurs: prompt lookup drafts at once


def small_vocab_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked distributions: drafts are kept often, and rejected often
    return model


def exact_distributions(model) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t1, t2) and p(t2, t3 | summed over t1) of sampling at TEMPERATURE, enumerated with full forwards."""
    with torch.no_grad():
        def next_probs(prefixes):
            logits = model(torch.tensor(prefixes)).logits[:, -1].float()
            return torch.softmax(logits / TEMPERATURE, dim=-1)

        p1 = next_probs([PROMPT])[0]
        p2 = next_probs([PROMPT + [a] for a in range(VOCAB)])  # [t1, t2]
        pairs = list(itertools.product(range(VOCAB), repeat=2))
        p3 = next_probs([PROMPT + [a, b] for a, b in pairs]).reshape(VOCAB, VOCAB, VOCAB)
    joint12 = p1[:, None] * p2
    joint23 = (joint12[:, :, None] * p3).sum(0)
    return joint12, joint23


@pytest.mark.parametrize("drafter", ["prompt_lookup", "draft_model"])
def test_engine_samples_keep_the_model_distribution(drafter):
    model = small_vocab_model(0)
    draft = small_vocab_model(1) if drafter == "draft_model" else None
    joint12, joint23 = exact_distributions(model)
    engine = Engine(model, PagedConfig(block_size=4, max_num_seqs=256, max_num_batched_tokens=2048))
    n = 3000
    ids = [engine.add_request(PROMPT, SamplingParams(max_new_tokens=3, do_sample=True, temperature=TEMPERATURE,
                                                     seed=seed, num_speculative_tokens=2, draft_model=draft))
           for seed in range(n)]
    while engine.has_unfinished:
        engine.step()
    engine.check_integrity()
    outs = [engine.pop_output(i).generated_tokens for i in ids]
    counts12, counts23 = torch.zeros(VOCAB, VOCAB), torch.zeros(VOCAB, VOCAB)
    for t1, t2, t3 in outs:
        counts12[t1, t2] += 1
        counts23[t2, t3] += 1
    stats = engine.stats()
    assert stats["accepted_tokens"] > 0.2 * n and stats["draft_tokens"] - stats["accepted_tokens"] > 0.2 * n, stats
    assert chi_square_p_value(counts12, joint12) > P_VALUE
    assert chi_square_p_value(counts23, joint23) > P_VALUE
