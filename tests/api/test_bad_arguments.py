"""A hostile caller's arguments to the patched `generate`, `generate_batch` and the scoring API (issue 36): each gets
a typed error naming the argument before any work, never a tensor error from deep inside, a traceback in the engine
loop, an argument ignored silently, or a row dropped from the answer."""

from __future__ import annotations

import pytest
import torch

import hf_paged
from hf_paged import SamplingParams
from hf_paged.errors import InvalidPromptError


@pytest.fixture(scope="module")
def model():
    model, _ = hf_paged.default_model()
    hf_paged.wrap(model, num_blocks=64)
    yield model
    hf_paged.unwrap(model)


@pytest.fixture(autouse=True)
def _pool_whole(model):
    yield
    engine = hf_paged.engine_of(model)
    with engine.lock:
        engine.check_integrity()
        assert engine.cache.pool.num_used_blocks == 0


IDS = torch.tensor([[258, 258, 5, 6, 7], [9, 10, 11, 12, 13]])  # 258: the embedded model's pad id
MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"input_ids": IDS, "attention_mask": MASK[:, 1:]}, ValueError, ["attention_mask has shape (2, 4)", "(2, 5)"]),
    ({"input_ids": IDS, "attention_mask": MASK[:1]}, ValueError, ["(1, 5)"]),  # was: row 1 dropped silently
    ({"input_ids": IDS[None]}, ValueError, ["[batch, sequence_length]", "(1, 2, 5)"]),
    ({"input_ids": IDS.float(), "attention_mask": MASK}, TypeError, ["integer tensor", "torch.float32"]),
])
def test_generate_refuses_inputs_it_would_misread(model, kwargs, error, words):
    with pytest.raises(error) as info:
        model.generate(**kwargs, max_new_tokens=2, pad_token_id=258)
    for word in words:
        assert word in str(info.value)


def test_generate_takes_a_one_dimensional_prompt_and_mask(model):
    row = model.generate(input_ids=IDS[1], attention_mask=MASK[1], max_new_tokens=3, pad_token_id=258)
    batch = model.generate(input_ids=IDS, attention_mask=MASK, max_new_tokens=3, pad_token_id=258)
    assert torch.equal(row[0], batch[1])


@pytest.mark.parametrize(("inputs", "words"), [
    (torch.tensor([[5, 6]]), ["not a tensor", "tolist()"]),  # was: "Boolean value of Tensor ... is ambiguous"
    ([[True, False]], ["True (bool)", "not a token id"]),  # was: run as [1, 0]
    ([[5.0, 6.0]], ["5.0 (float)"]),
    (["some text"], ["not a list of token ids (str)", "tokenizer(text).input_ids"]),
])
def test_generate_batch_refuses_what_is_not_token_ids(model, inputs, words):
    with pytest.raises(InvalidPromptError) as info:
        model.generate_batch(inputs, max_new_tokens=2)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"max_new_token": 5}, ValueError, ["['max_new_token']", "spelling"]),  # was: ran with the default 20 tokens
    ({"priorities": [1, 2]}, ValueError, ["one int per input (1)", "got 2"]),  # was: accepted
    ({"priorities": ["high"]}, TypeError, ["'high'"]),  # was: a traceback in the engine loop, the request FAILED
    ({"sampling_params": {"max_new_tokens": 3}}, TypeError, ["SamplingParams", "dict"]),  # was: AttributeError
    ({"generation_config": {"max_new_tokens": 3}}, TypeError, ["GenerationConfig", "dict", "keywords"]),  # was:
    # AttributeError: 'dict' object has no attribute 'to_dict'
    ({"sampling_params": SamplingParams(max_new_tokens=2), "max_new_tokens": 5}, ValueError, ["['max_new_tokens']"]),
    ({"sampling_params": SamplingParams(max_new_tokens=2), "logits_processor": [object()]}, ValueError,
     ["logits_processor", "logits_processors="]),  # was: the processor dropped silently, an unconstrained answer
])
def test_generate_batch_refuses_arguments_it_would_ignore_or_misuse(model, kwargs, error, words):
    with pytest.raises(error) as info:
        model.generate_batch([[5, 6, 7]], **kwargs)
    for word in words:
        assert word in str(info.value)


def test_generate_batch_keeps_its_own_generation_keywords(model):
    outs = model.generate_batch([[5, 6, 7]], max_new_tokens=3, do_sample=True, max_retries=1, priorities=[2])
    assert outs["req_0"].status.name == "FINISHED" and len(outs["req_0"].generated_tokens) == 3


@pytest.mark.parametrize("continuation", [[10**6], [5, -1]])
def test_loglikelihood_refuses_continuation_ids_outside_the_vocabulary(model, continuation):
    """The last continuation token is no prompt token, so the engine's prompt check never saw it: an id outside
    the vocabulary crashed the engine step, failing every request scheduled with it."""
    with pytest.raises(InvalidPromptError, match=r"request 0: token ids \[.*\] are outside the vocabulary"):
        model.loglikelihood([([5, 6], continuation)])
    assert model.loglikelihood([([5, 6], [7])])[0].logprob < 0  # the engine is fine


@pytest.mark.parametrize("temperature", [-1, -0.5, float("nan"), "hot", True, None])
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_temperature_that_is_not_a_number_at_least_zero_is_refused_greedy_or_not(temperature, do_sample):
    """Greedy requests took any temperature (-1, "hot") silently: it is unused there, but it is a caller's mistake."""
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        SamplingParams(do_sample=do_sample, temperature=temperature)
    assert SamplingParams(temperature=0).temperature == 0  # greedy by temperature 0 (the OpenAI convention) is fine


def test_a_greedy_generation_config_with_any_temperature_runs_as_stock(model):
    """transformers ignores the temperature of a greedy config (it warns): a drop-in must not refuse it."""
    from transformers import GenerationConfig

    config = GenerationConfig(temperature=-1.0, max_new_tokens=3, do_sample=False)
    assert SamplingParams.from_generation_config(config).temperature == 1.0
    ids = torch.tensor([[5, 6, 7]])
    wrapped = model.generate(ids, generation_config=config)
    hf_paged.unwrap(model)
    try:
        stock = model.generate(ids, generation_config=config)
    finally:
        hf_paged.wrap(model, num_blocks=64)
    assert torch.equal(wrapped, stock)


def test_min_new_tokens_with_a_constraint_is_refused():
    """Once the document is complete only EOS is allowed, and min_new_tokens held it back: greedy wrote token 0
    past the document, sampling failed with 'the sampling distribution is not finite'."""
    from hf_paged import RegexLogitsProcessor
    from tests.tiny_models import byte_tokenizer

    processor = RegexLogitsProcessor("ab", byte_tokenizer())
    with pytest.raises(ValueError, match="min_new_tokens holds EOS back past the end of a constrained document"):
        SamplingParams(min_new_tokens=3, logits_processors=[processor])
    SamplingParams(min_new_tokens=3)  # alone: fine


def test_generate_batch_options_passed_to_generate_name_generate_batch(model):
    for kwargs in ({"constraint_mode": "resample"}, {"max_retries": 2}):
        with pytest.raises(ValueError, match="are generate_batch options"):
            model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2, **kwargs)
