"""Generation inside training loops (RL-style rollouts): after every kind of weight update, a wrapped model's
`generate` (greedy, and sampled under the same `torch.manual_seed`) equals stock `generate` on the same weights,
with the prompts repeating so prefix hits are the norm. Stock runs on the same model object through the class's
`generate` (the engine switches the attention implementation only inside its own forwards)."""

import copy

import pytest
import torch

import hf_paged
from hf_paged import PagedConfig
from tests.tiny_models import left_pad, ragged_prompts, tiny_model

SYSTEM = ragged_prompts([40], seed=11)[0]
QUESTIONS = ragged_prompts([3, 6], seed=12)
PROMPTS = [SYSTEM + QUESTIONS[0], SYSTEM + QUESTIONS[0], SYSTEM + QUESTIONS[1], SYSTEM + QUESTIONS[1]]
NEW = 6


def _generate(model, *, stock: bool, **kwargs) -> torch.Tensor:
    ids, mask = left_pad(PROMPTS)
    generate = type(model).generate.__get__(model) if stock else model.generate
    return generate(ids, attention_mask=mask, max_new_tokens=NEW, **kwargs)


def _assert_matches_stock(model, seed: int) -> torch.Tensor:
    greedy = _generate(model, stock=False, do_sample=False)
    assert torch.equal(greedy, _generate(model, stock=True, do_sample=False))
    torch.manual_seed(seed)
    sampled = _generate(model, stock=False, do_sample=True, top_k=0)
    torch.manual_seed(seed)
    assert torch.equal(sampled, _generate(model, stock=True, do_sample=True, top_k=0))
    return sampled


def _noise(t: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.randn(t.shape, generator=torch.Generator().manual_seed(seed)) * 0.05


class _Optimizing:
    """loss -> backward -> (every `every` calls) optimizer.step(), as a policy-gradient loop does."""

    def __init__(self, make, every: int = 1, schedule=None):
        self.make, self.every, self.schedule = make, every, schedule
        self.optimizer = self.scheduler = None

    def __call__(self, model, rollouts, it):
        if self.optimizer is None:
            self.optimizer = self.make(model.parameters())
            self.scheduler = self.schedule(self.optimizer) if self.schedule else None
        model.train()
        (model(rollouts, labels=rollouts).loss / self.every).backward()
        model.eval()
        if (it + 1) % self.every == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
            if self.scheduler is not None:
                self.scheduler.step()


def _by_hand(edit):
    def update(model, rollouts, it):
        with torch.no_grad():
            edit(model, it)
    return update


def _ema():
    shadow = {}

    def update(model, rollouts, it):
        with torch.no_grad():
            for name, p in model.named_parameters():
                ema = shadow.setdefault(name, p.detach().clone())
                ema.mul_(0.5).add_(p + _noise(p, it) * 4, alpha=0.5)
                p.data.copy_(ema)  # (.data: no version counter moves)
    return update


UPDATES = {
    "fused AdamW": lambda: _Optimizing(lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True)),
    "Adam, learning rate scheduled to 0": lambda: _Optimizing(
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
        schedule=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: max(0.0, 1 - s / 2))),
    "SGD, accumulation over 2": lambda: _Optimizing(lambda ps: torch.optim.SGD(ps, lr=0.5), every=2),
    "load_state_dict": lambda: _by_hand(lambda m, it: m.load_state_dict(
        {k: v + _noise(v, it) for k, v in m.state_dict().items()})),
    "vector_to_parameters": lambda: _by_hand(lambda m, it: torch.nn.utils.vector_to_parameters(
        torch.nn.utils.parameters_to_vector(m.parameters()) * 1.05, m.parameters())),
    "EMA copied in through .data": _ema,
    "lm_head replaced": lambda: lambda m, rollouts, it: setattr(m, "lm_head", torch.nn.Linear(32, 96, bias=False)),
}


@pytest.mark.parametrize("update", list(UPDATES))
def test_rollouts_match_stock_after_every_update(update):
    model = tiny_model("llama", seed=4)
    hf_paged.wrap(model, block_size=8)
    step = UPDATES[update]()
    for it in range(4):
        rollouts = _assert_matches_stock(model, seed=100 + it)
        step(model, rollouts, it)
    assert hf_paged.engine_of(model).stats()["prompt_tokens_cached"] > 0  # prefix hits did happen


def test_tied_embeddings_updated_through_one_of_the_pair():
    model = tiny_model("qwen2", seed=4)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    hf_paged.wrap(model, block_size=8)
    for it in range(3):
        _assert_matches_stock(model, seed=it)
        with torch.no_grad():
            model.model.embed_tokens.weight.add_(_noise(model.lm_head.weight, it))


def test_value_updates_keep_the_lean_forward():
    """An optimizer step writes the weights in place: the K/V cached before are stale, but the lean forward reads the
    tensors at every call, so it is kept (its rebuild runs a self-check of probe forwards: ~0.2 s on a 100M model,
    at every rollout of an RL loop before); a tensor replaced rebuilds it."""
    model = tiny_model("llama", seed=4)
    hf_paged.wrap(model, block_size=8)
    _assert_matches_stock(model, seed=0)
    engine = hf_paged.engine_of(model)
    lean = engine.runner.lean
    assert lean is not None
    _Optimizing(lambda ps: torch.optim.SGD(ps, lr=0.5))(model, _generate(model, stock=True), 0)
    _assert_matches_stock(model, seed=1)
    assert engine.runner.lean is lean
    model.model.layers[0].mlp.up_proj.weight.data = model.model.layers[0].mlp.up_proj.weight.data * 1.5
    _assert_matches_stock(model, seed=2)
    assert engine.runner.lean is not lean


class _ScaledAdapter(torch.nn.Module):
    """A linear layer with a LoRA-like adapter whose `scaling` dict PEFT's `set_scale` / `scale_layer` change."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base = base
        self.delta = torch.nn.Linear(base.in_features, base.out_features, bias=False)
        torch.nn.init.normal_(self.delta.weight, std=1.0, generator=torch.Generator().manual_seed(3))
        self.scaling = {"default": 1.0}
        self.active_adapters = ["default"]

    @property
    def disable_adapters(self) -> bool:  # (a property, as PEFT's tuner layers)
        return False

    def forward(self, x):
        return self.base(x) + self.delta(x) * self.scaling["default"]


def test_adapter_scale_change_empties_the_prefix_cache():
    model = tiny_model("llama", seed=4)
    layer = model.model.layers[0]
    layer.mlp.down_proj = _ScaledAdapter(layer.mlp.down_proj)
    hf_paged.wrap(model, block_size=8)
    before = _assert_matches_stock(model, seed=0)
    layer.mlp.down_proj.scaling["default"] = 3.0
    assert not torch.equal(_assert_matches_stock(model, seed=0), before)  # (the scale changes the answer)


@pytest.mark.parametrize("edit", ["one layer", "a row of the head"])
def test_weights_changed_after_an_edit_the_fingerprint_cannot_see(edit):
    """`.data` edits of tensors other than the sampled ones, or between the sampled values, move no signal: the
    prefix cache (and the certified head's bf16 copy of the head) stayed stale. `hf_paged.weights_changed()` says
    it."""
    model = tiny_model("llama", seed=4)
    hf_paged.wrap(model, PagedConfig(block_size=8, certified_argmax=True))
    first = _generate(model, stock=False, do_sample=False)
    with torch.no_grad():
        if edit == "one layer":
            for p in model.model.layers[0].parameters():
                p.data.add_(_noise(p, 7) * 20)
        else:
            winner = first[0, -NEW]
            model.lm_head.weight.data[5] = model.lm_head.weight[winner] * 3  # (row 5: no sampled value)
    hf_paged.weights_changed()
    expected = _generate(model, stock=True, do_sample=False)
    assert not torch.equal(expected, first)  # (the edit changes the answer)
    assert torch.equal(_generate(model, stock=False, do_sample=False), expected)


def test_peft_lora_training_switching_and_merging():
    peft = pytest.importorskip("peft")
    model = tiny_model("llama", seed=4)
    config = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "init_lora_weights": False}
    tuned = peft.get_peft_model(model, peft.LoraConfig(target_modules=["q_proj", "v_proj"], **config))
    inner = tuned.base_model.model
    hf_paged.wrap(inner, block_size=8)
    trainable = [p for p in tuned.parameters() if p.requires_grad]
    step = _Optimizing(lambda ps: torch.optim.AdamW(trainable, lr=5e-2))
    for it in range(3):
        step(inner, _assert_matches_stock(inner, seed=it), it)
    with tuned.disable_adapter():
        _assert_matches_stock(inner, seed=10)
    tuned.add_adapter("other", peft.LoraConfig(target_modules=["k_proj"], **config))
    for name, seed in (("other", 11), ("default", 12), ("other", 13), ("default", 14)):
        tuned.set_adapter(name)
        before = _assert_matches_stock(inner, seed=seed)
    for layer in tuned.modules():
        if isinstance(layer, peft.tuners.lora.LoraLayer):
            layer.set_scale("default", 20.0)  # (LoRA scaling: no weight moves)
    assert not torch.equal(_assert_matches_stock(inner, seed=14), before)
    merged = copy.deepcopy(tuned).merge_and_unload()  # (the copy carries the wrapped state: a model of its own)
    hf_paged.unwrap(merged)
    hf_paged.wrap(merged, block_size=8)
    _assert_matches_stock(merged, seed=15)
    _assert_matches_stock(tuned.merge_and_unload(), seed=16)  # merged in place: the wrapped inner model


def _accelerate_mixed_precision(model) -> None:
    """What `Accelerator.prepare_model` does with mixed precision bf16 (Trainer `bf16=True`) on the CPU."""
    from accelerate.utils import convert_outputs_to_fp32

    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(torch.autocast("cpu", dtype=torch.bfloat16)(model.forward))


@pytest.mark.parametrize("autocast", ["torch.autocast", "accelerate's wrapper"])
def test_generate_under_autocast_runs_stock(autocast):
    """The engine computes in the weights' dtype: under autocast a fresh engine's first forward failed (keys fp32,
    values bf16) and a warm one stored rounded keys and values, neither what stock computes. `generate` falls back."""
    model = tiny_model("llama", seed=4)
    hf_paged.wrap(model, block_size=8)
    fp32 = _generate(model, stock=False, do_sample=False)  # (the engine warm, its prefix cache filled)
    if autocast == "accelerate's wrapper":
        _accelerate_mixed_precision(model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast == "torch.autocast"):
        with pytest.warns(hf_paged.PagedFallbackWarning, match="autocast"):
            mixed = _generate(model, stock=False, do_sample=False, output_scores=True, return_dict_in_generate=True)
        stock = _generate(model, stock=True, do_sample=False, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(mixed.sequences, stock.sequences)
    assert all(torch.equal(a, b) for a, b in zip(mixed.scores, stock.scores, strict=True))
    model.__dict__.pop("forward", None)
    assert torch.equal(_generate(model, stock=False, do_sample=False), fp32)


def test_generate_batch_under_autocast_computes_in_the_weights_dtype():
    model = tiny_model("llama", seed=4)
    hf_paged.wrap(model, block_size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # (a fresh engine: its first forward failed here)
        outputs = model.generate_batch(PROMPTS, max_new_tokens=NEW)
    assert all(o.error is None for o in outputs.values())
    ids, mask = left_pad(PROMPTS)
    stock = type(model).generate(model, ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert [o.generated_tokens for o in outputs.values()] == stock[:, -NEW:].tolist()
    _accelerate_mixed_precision(model)
    with pytest.raises(hf_paged.errors.UnsupportedGenerationError, match="keep_fp32_wrapper=False"):
        model.generate_batch(PROMPTS, max_new_tokens=NEW)


def test_scoring_and_engine_steps_under_autocast():
    """Scoring (and any engine step) under autocast: a fresh pool took two dtypes (keys fp32, values bf16) and every
    later request failed, autocast or not. The engine's forwards run with autocast off."""
    model = tiny_model("llama", seed=4)
    hf_paged.wrap(model, block_size=8)
    context, continuation = PROMPTS[0], [7, 8, 9]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = model.loglikelihood([(context, continuation)])[0]
    plain = model.loglikelihood([(context, continuation)])[0]
    with torch.no_grad():
        logits = type(model).forward(model, torch.tensor([context + continuation[:-1]])).logits[0, len(context) - 1:]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor([continuation]).T).sum().item()
    assert mixed.logprob == plain.logprob and plain.logprob == pytest.approx(expected, abs=1e-4)
    engine = hf_paged.engine_of(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        request = engine.add_request(PROMPTS[2], hf_paged.SamplingParams(max_new_tokens=NEW))
        output = engine.run([request])[request]
    stock = type(model).generate(model, torch.tensor([PROMPTS[2]]), max_new_tokens=NEW, do_sample=False)
    assert output.generated_tokens == stock[0, -NEW:].tolist()
    _accelerate_mixed_precision(model)
    with pytest.raises(hf_paged.errors.UnsupportedGenerationError, match="loglikelihood on a model"):
        model.loglikelihood([(context, continuation)])
