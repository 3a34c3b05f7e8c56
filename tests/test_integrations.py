"""A real Trainer with the paged evaluation callback; models placed with accelerate's device_map."""

import pytest
import torch
from transformers import Trainer, TrainingArguments

import hf_paged
from hf_paged.integrations import PagedGenerationCallback
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 24, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.rows = torch.randint(3, 96, (n, length), generator=g)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


@pytest.mark.parametrize("prewrapped", [False, True])
def test_trainer_callback_generates_fresh_outputs_after_each_step(tmp_path, prewrapped):
    model = tiny_model("llama")
    system = ragged_prompts([40], seed=11)[0]
    prompts = [system + q for q in ragged_prompts([3, 5, 7], seed=12)]  # shared prefix: stale hits would show
    if prewrapped:
        hf_paged.wrap(model, block_size=8)

    def matches_stock(texts, references):
        """Stock greedy generate on the weights of this moment (unwrapped), against the callback's outputs."""
        was_wrapped = hf_paged.is_wrapped(model)
        hf_paged.unwrap(model)
        expected = stock_greedy(model, prompts, 8)
        if was_wrapped:
            hf_paged.wrap(model, block_size=8)
        return float([[int(t) for t in text.split()] for text in texts] == expected)

    modes = []

    class ModeChecking(PagedGenerationCallback):
        def evaluate(self, model, tokenizer=None, step=0):
            before = model.training
            logs = super().evaluate(model, tokenizer, step)
            modes.append((before, model.training, hf_paged.is_wrapped(model)))
            return logs

    callback = ModeChecking(prompts, metric=matches_stock, max_new_tokens=8,
                            paged_config=hf_paged.PagedConfig(block_size=8))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, eval_strategy="steps", eval_steps=2,
                             per_device_train_batch_size=4, per_device_eval_batch_size=4, learning_rate=5e-2,
                             report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(16), eval_dataset=RandomTokens(4, seed=1),
                      callbacks=[callback])
    trainer.train()

    assert len(callback.history) == 2
    first, second = callback.history
    # each evaluation equals stock generate on the weights of that moment: no stale prefix cache
    assert first["metrics"]["eval_generation_matches_stock"] == 1.0
    assert second["metrics"]["eval_generation_matches_stock"] == 1.0
    assert first["tokens"] != second["tokens"]  # the weights moved, and the outputs with them
    assert first["engine_stats"]["steps"] > 0 and second["engine_stats"]["generated_tokens"] > 0  # paged engine
    logged = [h for h in trainer.state.log_history if "eval_generation_matches_stock" in h]
    assert len(logged) == 2 and "eval_generation_tokens_per_s" in logged[0]
    assert all(before == after and wrapped == prewrapped for before, after, wrapped in modes)


def test_device_map_model_generates(tmp_path):
    from transformers import AutoModelForCausalLM

    source = tiny_model("llama")
    source.save_pretrained(tmp_path / "m")
    expected = stock_greedy(source, ragged_prompts([6, 9]), 6)
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path / "m", device_map={"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                                    "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"},
        offload_folder=str(tmp_path / "offload"))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    hf_paged.wrap(model)
    outs = model.generate_batch(ragged_prompts([6, 9]), max_new_tokens=6)
    assert [o.generated_tokens for o in outs.values()] == expected


def _stock_without_autocast(model, prompts, max_new_tokens):
    """Stock greedy generate with the model's own forward (accelerate's mixed-precision wrapper set aside)."""
    wrapper = model.__dict__.pop("forward", None)
    try:
        was_wrapped = hf_paged.is_wrapped(model)
        hf_paged.unwrap(model)
        expected = stock_greedy(model, prompts, max_new_tokens)
        if was_wrapped:
            hf_paged.wrap(model, block_size=8)
        return expected
    finally:
        if wrapper is not None:
            model.forward = wrapper


@pytest.mark.parametrize("prewrapped", [False, True])
def test_trainer_callback_under_mixed_precision(tmp_path, prewrapped):
    """Trainer(bf16=True) on fp32 weights: accelerate wraps `model.forward` in autocast. The engine's first forward
    under it failed (keys and values of two dtypes) and every evaluation logged the metric of empty texts (0.0),
    silently. The callback now generates with the original forward and puts the wrapper back."""
    model = tiny_model("llama")
    system = ragged_prompts([40], seed=11)[0]
    prompts = [system + q for q in ragged_prompts([3, 5, 7], seed=12)]
    if prewrapped:
        hf_paged.wrap(model, block_size=8)
    forwards, states = [], []

    def matches_stock(texts, references):
        forwards.append(model.__dict__.get("forward"))  # (the metric runs after the wrapper was put back)
        return float([[int(t) for t in text.split()] for text in texts] == _stock_without_autocast(model, prompts, 8))

    class StateChecking(PagedGenerationCallback):
        def evaluate(self, model, tokenizer=None, step=0):
            before = (model.training, model.config.use_cache, hf_paged.is_wrapped(model))
            logs = super().evaluate(model, tokenizer, step)
            states.append((before, (model.training, model.config.use_cache, hf_paged.is_wrapped(model))))
            return logs

    callback = StateChecking(prompts, metric=matches_stock, max_new_tokens=8,
                             paged_config=hf_paged.PagedConfig(block_size=8))
    # (activation checkpointing sets config.use_cache = False; eval_on_start evaluates before any step)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, eval_strategy="steps", eval_steps=2, bf16=True,
                             activation_checkpointing=True, eval_on_start=True,
                             per_device_train_batch_size=4, per_device_eval_batch_size=4, learning_rate=5e-2,
                             report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=RandomTokens(16), eval_dataset=RandomTokens(4, seed=1),
            callbacks=[callback]).train()
    assert [h["step"] for h in callback.history] == [0, 2, 4]
    assert [h["metrics"]["eval_generation_matches_stock"] for h in callback.history] == [1.0, 1.0, 1.0]
    assert all(h["tokens"] and all(h["tokens"]) for h in callback.history)
    assert forwards[0] is not None and all(f is forwards[0] for f in forwards)  # accelerate's wrapper, kept
    assert model.__dict__.get("forward") is forwards[0] and hf_paged.is_wrapped(model) == prewrapped
    assert all(before == after for before, after in states)  # mode, use_cache, wrap state as found


def test_callback_evaluates_inside_autocast():
    model = tiny_model("llama")
    prompts = ragged_prompts([12, 7], seed=3)
    callback = PagedGenerationCallback(prompts, max_new_tokens=6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        callback.evaluate(model)
    assert callback.history[-1]["tokens"] == stock_greedy(model, prompts, 6)


def test_callback_raises_when_a_generation_fails():
    """A prompt the engine refuses (longer than the model's positions) ended FAILED with no tokens, and the
    callback scored its empty text."""
    model = tiny_model("llama")
    callback = PagedGenerationCallback([[5] * 600, [6, 7, 8]], references=["", ""], max_new_tokens=4)
    with pytest.raises(hf_paged.errors.RequestFailedError, match="prompt 0 failed at step 3: prompt of 600 tokens"):
        callback.evaluate(model, step=3)
    assert not hf_paged.is_wrapped(model) and not model.training
