"""A hook a user registers sees every forward the engine runs: the lean forward (and the certified head's greedy
path over it) steps aside for a module's own hooks and for global ones (`register_module_forward_hook`: profilers,
activation capture), as the stock forward would call them."""

from __future__ import annotations

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import stock_greedy, tiny_model


def _hooked_run(model, engine, register) -> list[str]:
    seen: list[str] = []
    handle = register(lambda module, args, output: seen.append(type(module).__name__))
    try:
        assert not engine.runner.lean.usable()
        rid = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=3))
        out = engine.run([rid])[rid]
    finally:
        handle.remove()
    assert out.generated_tokens == stock_greedy(model, [[5, 6, 7]], 3)[0]
    assert engine.runner.lean.usable()  # the hook removed: the lean forward again
    return seen


@pytest.mark.parametrize("certified", [False, True])
def test_a_global_forward_hook_sees_every_forward(certified):
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=8, certified_argmax=certified))
    assert engine.runner.lean is not None and (engine.runner.certified is not None) is certified
    if certified:
        assert engine.runner.certified.ready(60)
    seen = _hooked_run(model, engine, torch.nn.modules.module.register_module_forward_hook)
    assert seen.count("LlamaMLP") == 3 * 2  # one prefill and two decode forwards, two layers each


def test_a_module_hook_sees_every_greedy_forward_of_the_certified_head():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=8, certified_argmax=True))
    assert engine.runner.certified is not None and engine.runner.certified.ready(60)
    seen = _hooked_run(model, engine, model.model.layers[1].mlp.register_forward_hook)
    assert seen == ["LlamaMLP"] * 3
