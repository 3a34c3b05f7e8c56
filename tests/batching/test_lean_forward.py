"""The lean forward (`batching/lean_forward.py`): bit for bit the stock modules' logits, and the stock forward
wherever that cannot be shown (other families, hooks, patched modules, modules changed after the build)."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.lean_forward import LeanForward
from tests.tiny_models import DECODER, ragged_prompts, tiny_model


def _logits_of(engine: Engine, prompts, new_tokens: int = 6) -> list[torch.Tensor]:
    """Every logits tensor the engine's forwards return while it generates greedily for `prompts`."""
    seen, forward = [], engine.runner.forward

    def recording(*args, **kwargs):
        seen.append(forward(*args, **kwargs))
        return seen[-1]

    engine.runner.forward = recording
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=new_tokens)) for p in prompts]
    engine.run(ids)
    return seen


def _sliding_qwen2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(**{**DECODER, "num_hidden_layers": 3}, use_sliding_window=True, sliding_window=8,
                         max_window_layers=1)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return model


def _llama_with_biases() -> torch.nn.Module:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**DECODER, attention_bias=True, mlp_bias=True)).eval()
    model.generation_config.eos_token_id = None
    return model


VARIANTS = {"qwen2-sliding": _sliding_qwen2, "llama-biases": _llama_with_biases}


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen2-sliding", "llama-biases"])
def test_lean_logits_equal_the_stock_modules_bit_for_bit(family, kernels_ready):
    model = VARIANTS[family]() if family in VARIANTS else tiny_model(family)
    prompts = ragged_prompts([5, 30, 17, 1])
    config = PagedConfig(block_size=8, max_num_batched_tokens=24)  # chunked prefills beside decodes
    lean, stock = Engine(model, config), Engine(model, config)
    stock.runner.lean = None
    assert lean.runner.lean is not None
    got, want = _logits_of(lean, prompts), _logits_of(stock, prompts)
    assert len(got) == len(want) > 3
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_other_families_keep_the_stock_forward():
    for family in ("gpt2", "gemma", "phi3"):
        assert LeanForward.build(tiny_model(family)) is None


def test_a_forward_hook_sends_the_step_through_the_stock_modules():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=8))
    calls = []
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *args: calls.append(1))
    try:
        assert not engine.runner.lean.usable()
        rid = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=3))
        engine.run([rid])
    finally:
        handle.remove()
    assert len(calls) == 3  # one prefill and two decode forwards ran the hooked module
    assert engine.runner.lean.usable()


def test_a_module_that_computes_differently_fails_the_self_check(monkeypatch):
    model = tiny_model("llama")
    norm = type(model.model.norm)
    stock_forward = norm.forward
    monkeypatch.setattr(norm, "forward", lambda self, x: stock_forward(self, x) * 1.0001)
    assert LeanForward.build(model) is None
    monkeypatch.undo()
    assert LeanForward.build(model) is not None


def test_a_compiled_module_is_not_bypassed():
    model = tiny_model("llama")
    lean = LeanForward.build(model)
    model.model.layers[1].mlp.compile()  # sets the compiled call; nothing compiles until it is called
    assert not lean.usable() and LeanForward.build(model) is None


def test_a_per_instance_forward_is_not_bypassed():
    model = tiny_model("llama")
    lean = LeanForward.build(model)
    attn = model.model.layers[0].self_attn
    attn.forward = attn.forward  # what accelerate's hooks and some patchers do
    assert not lean.usable() and LeanForward.build(model) is None


def test_a_module_swapped_after_the_build_keeps_the_stock_forward():
    model = tiny_model("llama")
    engine = Engine(model, PagedConfig(block_size=8))
    assert engine.runner.lean is not None

    class Scaled(torch.nn.Module):  # an adapter-like wrapper: another module class with its own parameter
        def __init__(self, inner):
            super().__init__()
            self.inner, self.scale = inner, torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return self.inner(x) * self.scale

    mlp = model.model.layers[0].mlp
    mlp.down_proj = Scaled(mlp.down_proj)
    assert not engine.runner.lean.usable()  # seen at once, even by a decode step that runs no weights check
    rid = engine.add_request([5, 6, 7], SamplingParams(max_new_tokens=2))
    engine.run([rid])  # admitting it runs the weights check, which sees the new parameter and builds anew
    assert engine.runner.lean is None


def test_bf16_lean_logits_equal_the_stock_modules():
    """Half precision keeps the stock casts (the fp32 shortcut is skipped) and the torch attention path."""
    model = tiny_model("llama").to(torch.bfloat16)
    prompts = ragged_prompts([9, 4])
    lean, stock = Engine(model, PagedConfig(block_size=8)), Engine(model, PagedConfig(block_size=8))
    stock.runner.lean = None
    assert lean.runner.lean is not None
    got, want = _logits_of(lean, prompts, 4), _logits_of(stock, prompts, 4)
    assert len(got) == len(want) > 1 and all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_replaced_projection_class_keeps_the_stock_forward():
    """An adapter that adds nothing yet (LoRA's B starts at zero) agrees with the probe; its class refuses it."""
    model = tiny_model("llama")

    class Adapted(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) + 0.0 * x.sum()

    proj = model.model.layers[0].self_attn.v_proj
    adapted = Adapted(proj.in_features, proj.out_features, bias=False)
    adapted.load_state_dict(proj.state_dict())
    model.model.layers[0].self_attn.v_proj = adapted
    assert LeanForward.build(model) is None


def test_another_threads_plain_forward_during_the_self_check_keeps_its_attention(monkeypatch):
    """The probe attention is switched in on the shared config: a plain forward that another thread runs meanwhile
    gets the model's own attention, not the probe."""
    from hf_paged.batching import lean_forward

    model = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = model(ids).logits
    got, original = [], lean_forward._Records.attend

    def attend(self, *args):
        if not got:  # the first probe call: the stock model's probe forward is under way in this thread
            thread = threading.Thread(target=lambda: got.append(model(ids).logits.detach()))
            thread.start()
            thread.join()
        return original(self, *args)

    monkeypatch.setattr(lean_forward._Records, "attend", attend)
    assert LeanForward.build(model) is not None
    assert torch.equal(got[0], want)
