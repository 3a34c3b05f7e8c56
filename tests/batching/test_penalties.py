"""OpenAI's presence/frequency penalties and logit_bias (`batching/penalties.py`) against an oracle: stock `generate`
with a processor that applies them as OpenAI documents them (over the generated tokens only), in vLLM's order."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.batching.penalties import apply_logit_bias, apply_output_penalties
from hf_paged.errors import InvalidConfigError
from tests.tiny_models import VOCAB, ragged_prompts, tiny_model


class OpenAIBias(LogitsProcessor):
    def __init__(self, bias: dict[int, float]) -> None:
        self.bias = bias

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for token, value in self.bias.items():
            scores[:, token] += value
        return scores


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's definition, token by token: mu[j] -= c[j] * frequency + (c[j] > 0) * presence, c counted over the
    tokens generated after `prompt_len`."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for b, row in enumerate(input_ids.tolist()):
            generated = row[self.prompt_len:]
            for token in set(generated):
                scores[b, token] -= generated.count(token) * self.frequency + self.presence
        return scores


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def oracle(model, prompt, max_new_tokens, *, presence=0.0, frequency=0.0, bias=None, repetition=None):
    procs = [OpenAIBias(bias)] if bias else []
    procs += [RepetitionPenaltyLogitsProcessor(repetition)] if repetition else []
    procs += [OpenAIPenalties(len(prompt), presence, frequency)]
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         logits_processor=LogitsProcessorList(procs), eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run(engine, requests):
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    return [engine.pop_output(i) for i in ids]


CASES = [  # (presence, frequency, bias, repetition): each changes this model's greedy text (checked below)
    {"frequency": 1.5},
    {"presence": 2.0},
    {"presence": -1.0, "frequency": -2.0},  # negative: repeat
    {"bias": {7: 6.0, 11: -100.0, 40: 3.5}},
    {"presence": 0.7, "frequency": 0.4, "bias": {7: 2.0}, "repetition": 1.4},  # the order among them matters
]


def test_greedy_output_equals_the_oracle_whatever_the_batch_and_chunking(model):
    prompts = ragged_prompts([5, 19, 33, 8, 12], seed=4)
    expected = [oracle(model, p, 24, **case) for p, case in zip(prompts, CASES)]
    plain = [oracle(model, p, 24) for p in prompts]
    assert all(e != q for e, q in zip(expected, plain))  # each case changes the text: the comparison can fail
    for block_size, budget in ((4, 7), (16, 512)):  # chunked prefill over small blocks, and one step per prompt
        engine = Engine(model, PagedConfig(block_size=block_size, num_blocks=128, max_num_batched_tokens=budget))
        requests = []
        for prompt, case in zip(prompts, CASES):
            processors = [RepetitionPenaltyLogitsProcessor(case["repetition"])] if "repetition" in case else []
            requests.append((prompt, SamplingParams(
                max_new_tokens=24, presence_penalty=case.get("presence", 0.0),
                frequency_penalty=case.get("frequency", 0.0), logit_bias=case.get("bias"),
                logits_processors=processors)))
        outs = run(engine, requests + [(prompts[0], SamplingParams(max_new_tokens=24))])  # a plain row beside them
        assert [o.generated_tokens for o in outs] == expected + [plain[0]]


def test_speculative_decoding_counts_the_drafts_before_each_position(model):
    """A verification scores drafted position i with the drafts before it as output: greedy tokens are those of
    plain decoding, and a seeded sampled request's are those it draws alone without speculation."""
    prompt = ragged_prompts([6], seed=2)[0] * 4  # a repeating prompt: prompt lookup drafts and some are kept
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=128))
    # negative penalties: every draft of the loop kept; a positive one with a bias: drafts a count without the
    # drafts before them would keep (this case failed when verification counted the output alone)
    kinds = [{"frequency_penalty": -2.0, "presence_penalty": -1.0}, {"frequency_penalty": 0.5, "logit_bias": {3: 2.0}}]
    accepted = []
    for sampled in (False, True):
        for kind in kinds:
            extra = {"do_sample": True, "temperature": 0.8, "seed": 11} if sampled else {}
            alone, = run(engine, [(prompt, SamplingParams(max_new_tokens=30, **kind, **extra))])
            spec, _ = run(engine, [
                (prompt, SamplingParams(max_new_tokens=30, num_speculative_tokens=4, **kind, **extra)),
                (prompt[:9], SamplingParams(max_new_tokens=12, do_sample=True, seed=5))])
            assert spec.generated_tokens == alone.generated_tokens, (sampled, kind)
            accepted.append(spec.num_accepted_tokens)
    assert min(accepted[0], accepted[2]) > 10  # drafts kept: positions were scored with pending drafts before them


def test_penalties_apply_exactly_and_leave_a_masked_token_masked():
    torch.manual_seed(0)
    row = torch.randn(1, VOCAB)
    row[0, 9] = float("-inf")  # a constraint's mask
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=-1.25)
    got = apply_output_penalties(row.clone(), params, [4, 9, 4, 17], pending=[4, 30])
    expected = row.clone()
    for token, count in {4: 3, 9: 1, 17: 1, 30: 1}.items():
        expected[0, token] -= count * -1.25 + 0.5
    torch.testing.assert_close(got, expected)
    biased = apply_logit_bias(row.clone(), {9: 100.0, 2: -100.0, 5: 1.5})
    assert biased[0, 9] == float("-inf") and biased[0, 2] == row[0, 2] - 100 and biased[0, 5] == row[0, 5] + 1.5
    assert torch.equal(apply_output_penalties(row.clone(), params, []), row)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"presence_penalty": 2.5}, "presence_penalty must be a number in \\[-2, 2\\]"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"presence_penalty": True}, "presence_penalty"),
    ({"logit_bias": {3: 101}}, "logit_bias\\[3\\] must be a number in \\[-100, 100\\]"),
    ({"logit_bias": {3: float("inf")}}, "logit_bias\\[3\\]"),
    ({"logit_bias": {-1: 1.0}}, "keys must be token ids"),
    ({"logit_bias": {"3": 1.0}}, "keys must be token ids"),
    ({"logit_bias": [(3, 1.0)]}, "must be a dict"),
])
def test_bad_values_are_refused_naming_the_field(kwargs, match):
    with pytest.raises(InvalidConfigError, match=match):
        SamplingParams(**kwargs)


def test_a_bias_outside_the_vocabulary_fails_that_request_alone(model):
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
    prompt = ragged_prompts([7], seed=3)[0]
    bad, good = run(engine, [(prompt, SamplingParams(max_new_tokens=5, logit_bias={VOCAB: 1.0})),
                             (prompt, SamplingParams(max_new_tokens=5))])
    assert bad.status == RequestStatus.FAILED and f"[{VOCAB}]" in bad.error and "logit_bias" in bad.error
    assert good.status == RequestStatus.FINISHED and len(good.generated_tokens) == 5
    assert engine.cache.pool.num_used_blocks == 0
