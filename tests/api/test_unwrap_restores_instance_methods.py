"""`unwrap` gives back what the model's instance held before `wrap`: a `generate` that another library set on the
instance (a hook, an adapter's) comes back, not the class's."""

from __future__ import annotations

from types import MethodType

import hf_paged
from tests.tiny_models import tiny_model


def test_unwrap_restores_a_generate_set_on_the_instance_before_wrap():
    model = tiny_model("llama")

    def own_generate(self, *args, **kwargs):
        return "own"

    model.generate = MethodType(own_generate, model)
    hf_paged.wrap(model)
    assert model.generate.__func__ is not own_generate
    hf_paged.unwrap(model)
    assert model.generate() == "own"
    assert "generate_batch" not in model.__dict__ and "loglikelihood" not in model.__dict__
