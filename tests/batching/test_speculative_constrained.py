"""Speculative decoding of constrained requests: drafts the constraint forbids are rejected, kept drafts advance
the constraint's state exactly as decoding one token at a time does."""

import json

import pytest
import torch
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

from hf_paged import Engine, JSONSchemaLogitsProcessor, PagedConfig, RequestStatus, SamplingParams
from hf_paged.batching.speculative import Draft
from tests.batching.test_constrained_engine import SCHEMA, model_and_tokenizer

MAX_NEW = 60


class OracleDrafter:
    """Drafts a known continuation (each request's stock output), with every token after `num_right` replaced by
    `wrong`: the first `num_right` drafts are right, the next one is `wrong`."""

    def __init__(self, expected: dict[int, list[int]], wrong: int, num_right: int = 99) -> None:
        self.expected, self.wrong, self.num_right = expected, wrong, num_right

    def propose(self, requests, num_tokens):
        drafts = []
        for request, k in zip(requests, num_tokens):
            future = self.expected[len(request.prompt_ids)][len(request.output_ids):]
            draft = [t if i < self.num_right else self.wrong for i, t in enumerate(future[:k])]
            drafts.append(Draft(draft + [self.wrong] * (k - len(draft))))
        return drafts

    def release(self, request_id):
        pass

    def check_integrity(self, live_ids):
        pass


@pytest.fixture(scope="module")
def setup():
    model, tok = model_and_tokenizer()
    proc = JSONSchemaLogitsProcessor(SCHEMA, tok)
    prompts = [tok(p)["input_ids"] for p in ("Pets: ", "Tell me about 3 cats as JSON:", "{", "count")]
    stock = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False, logits_processor=[proc],
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        stock.append(out[0, len(p):].tolist())
    return model, tok, proc, prompts, stock


def run(engine, prompts, params):
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return [engine.pop_output(i) for i in ids]


@pytest.mark.parametrize("num_right", [0, 1, 3, 99])
def test_forbidden_drafts_are_rejected_and_kept_ones_advance_the_constraint(setup, num_right):
    model, tok, proc, prompts, stock = setup
    z = tok("Z")["input_ids"][0]  # the schema allows no "Z" anywhere: every "Z" draft is outside the mask
    engine = Engine(model, PagedConfig(block_size=8))
    engine.speculator.prompt_lookup = OracleDrafter({len(p): s for p, s in zip(prompts, stock)}, z, num_right)
    params = SamplingParams(max_new_tokens=MAX_NEW, eos_token_id=tok.eos_token_id, logits_processors=[proc],
                            num_speculative_tokens=6)
    outs = run(engine, prompts, params)
    assert [o.generated_tokens for o in outs] == stock
    stats = engine.stats()
    assert stats["draft_tokens"] > 0
    if num_right == 0:
        assert stats["accepted_tokens"] == 0  # every "Z" rejected by the mask
    if num_right == 99:
        assert stats["accepted_tokens"] > 0
    for out in outs:
        doc = json.loads(tok.decode(out.generated_tokens, skip_special_tokens=True))
        assert doc["kind"] in ("cat", "dog") and 0 <= doc["count"] <= 99
    assert proc.num_active_requests == 0  # every request's guide state released


def test_prompt_lookup_with_a_schema_matches_stock(setup):
    model, tok, proc, prompts, stock = setup
    engine = Engine(model, PagedConfig(block_size=4, max_num_batched_tokens=24))
    params = SamplingParams(max_new_tokens=MAX_NEW, eos_token_id=tok.eos_token_id, logits_processors=[proc],
                            num_speculative_tokens=4, prompt_lookup_max_ngram=2)
    outs = run(engine, prompts, params)
    assert [o.generated_tokens for o in outs] == stock


def test_sampled_constrained_output_stays_valid(setup):
    model, tok, proc, prompts, _ = setup
    engine = Engine(model, PagedConfig(block_size=8))
    outs = []
    for seed in range(6):
        params = SamplingParams(max_new_tokens=MAX_NEW, eos_token_id=tok.eos_token_id, logits_processors=[proc],
                                do_sample=True, temperature=1.5, seed=seed, num_speculative_tokens=5,
                                prompt_lookup_max_ngram=2)
        outs += run(engine, prompts, params)
    assert engine.stats()["draft_tokens"] > 0
    for out in outs:
        assert out.status is RequestStatus.FINISHED
        doc = json.loads(tok.decode(out.generated_tokens, skip_special_tokens=True))
        assert doc["kind"] in ("cat", "dog") and 0 <= doc["count"] <= 99


def test_stateless_user_processors_see_each_drafted_position_history(setup):
    """transformers processors that read the history (n-gram bans, repetition penalty) get the drafts before each
    position as part of it: the output equals stock generate with the same processors."""
    model, tok, _, prompts, _ = setup
    procs = [NoRepeatNGramLogitsProcessor(2), RepetitionPenaltyLogitsProcessor(1.3)]
    stock = []
    for p in prompts:
        out = model.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False, logits_processor=procs,
                             eos_token_id=None, pad_token_id=tok.eos_token_id)
        stock.append(out[0, len(p):].tolist())
    engine = Engine(model, PagedConfig(block_size=8))
    engine.speculator.prompt_lookup = OracleDrafter({len(p): s for p, s in zip(prompts, stock)}, 0, num_right=3)
    outs = run(engine, prompts, SamplingParams(max_new_tokens=30, logits_processors=procs, num_speculative_tokens=5))
    assert [o.generated_tokens for o in outs] == stock
    assert engine.stats()["accepted_tokens"] > 0
