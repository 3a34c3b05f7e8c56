"""A generate_until request without `temperature` is greedy, as lm-eval's `hf` backend makes it (temperature 0 unless
given, and 0 means greedy), even when the model's own generation config samples: a checkpoint shipped with
`do_sample: true` must not turn an evaluation into a draw."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")

import torch
from lm_eval.api.instance import Instance

from hf_paged.api.models import default_model
from hf_paged.integrations.lm_eval import PagedLM


def _requests(gen_kwargs: dict) -> list[Instance]:
    contexts = ["the cat sat on", "a dog ran to the", "where birds"]
    return [Instance(request_type="generate_until", doc={}, arguments=(c, dict(gen_kwargs)), idx=0,
                     metadata=("t", d, 1)) for d, c in enumerate(contexts)]


def test_no_temperature_is_greedy_even_when_the_model_config_samples():
    model, tok = default_model()
    model.generation_config.do_sample, model.generation_config.temperature = True, 1.0
    model.generation_config.top_k, model.generation_config.top_p = None, None
    lm = PagedLM(pretrained=model, tokenizer=tok, max_length=64)
    asked = {"until": ["\n\n"], "max_gen_toks": 12}
    torch.manual_seed(1)
    first = lm.generate_until(_requests(asked))
    torch.manual_seed(2)
    assert lm.generate_until(_requests(asked)) == first  # not a draw: other seeds, the same text
    assert lm.generate_until(_requests({**asked, "temperature": 0.0, "do_sample": False})) == first  # greedy's
    torch.manual_seed(3)
    sampled = lm.generate_until(_requests({**asked, "temperature": 1.0, "do_sample": True}))
    assert sampled != first  # the premise: this model's draws differ from its greedy text
