"""Evaluation inside training: a `TrainerCallback` that generates with the paged engine at every evaluation.

    callback = PagedGenerationCallback(prompts, tokenizer=tok, references=answers, metric=exact_match)
    Trainer(model=model, args=args, ..., callbacks=[callback]).train()
    # every evaluation logs e.g. {"eval_generation_exact_match": 0.4, "eval_generation_tokens_per_s": 812.0}

Correct while the weights change between evaluations: the engine fingerprints the weights before every step and
drops its prefix cache when they moved, so no K/V computed under old weights is ever reused. The model is left as
found: its train/eval mode is restored, and it is unwrapped again unless it was wrapped before.

Mixed precision (`TrainingArguments(bf16=True)` / `fp16=True` on fp32 weights): accelerate replaces `model.forward`
with an autocast wrapper (keeping the original as `model._original_forward`). The engine computes in the weights'
dtype and does not follow autocast (its first forward under it failed: keys and values of two dtypes), so each
evaluation generates with the original forward, as the model saved at the end computes, and puts the wrapper back.
A prompt whose generation fails raises `RequestFailedError` naming it (its empty text was scored before).

Several processes (`torchrun` / `accelerate launch`, Trainer in DDP): Trainer calls `on_evaluate` on every rank;
each rank generates its shard of the prompts (`hf_paged.distributed.run_sharded`), the outputs are gathered, and
every rank computes and logs the same numbers on all prompts (as Trainer's own eval metrics are the same on every
rank; its reporters write from the main process only). Throughput counts every rank's tokens over the slowest
rank's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from hf_paged.api.autocast import original_forward
from hf_paged.config import PagedConfig
from hf_paged.distributed import run_sharded, world
from hf_paged.errors import RequestFailedError


def exact_match(texts: Sequence[str], references: Sequence[str]) -> float:
    """Share of generations equal to their reference after stripping whitespace."""
    return sum(t.strip() == r.strip() for t, r in zip(texts, references)) / max(len(texts), 1)


def json_validity(texts: Sequence[str], references: Sequence[Any] | None = None, schema: dict | None = None) -> float:
    """Share of generations that parse as JSON (and validate against `schema` when jsonschema is installed)."""
    import json

    valid = 0
    for text in texts:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            continue
        if schema is not None:
            try:
                import jsonschema

                if not jsonschema.Draft202012Validator(schema).is_valid(doc):
                    continue
            except ImportError:
                pass
        valid += 1
    return valid / max(len(texts), 1)


class PagedGenerationCallback(TrainerCallback):
    """At each evaluation, generate for `prompts` with the paged engine and log a metric and the throughput.

    Args:
        prompts: strings (needs `tokenizer`) or token-id lists.
        tokenizer: encodes string prompts and decodes outputs for the metric (default: the Trainer's
            `processing_class`).
        references: passed to `metric` with the decoded generations.
        metric: `metric(texts, references) -> float | dict[str, float]`; default `exact_match` when references are
            given, else `json_validity` when a schema is given, else none (throughput only).
        schema: a JSON schema constraining every generation (`JSONSchemaLogitsProcessor`).
        max_new_tokens: tokens to generate per prompt (greedy).
        paged_config: engine settings when the callback wraps the model itself.
        prefix: name prefix of the logged values.
        distributed: spread the prompts over the ranks of `torch.distributed` (every rank must evaluate); None:
            whenever the job has more than one process. A tensor-parallel model generates every prompt on every
            rank together; weights sharded by FSDP / ZeRO-3 are refused (`UnsupportedModelError`).

    After each evaluation `self.history` holds `{"step", "texts", "tokens", "metrics", "engine_stats"}` (this
    rank's engine), plus `"engine_stats_by_rank"` when several processes generated.
    """

    def __init__(self, prompts: Sequence[str] | Sequence[Sequence[int]], *, tokenizer=None,
                 references: Sequence[Any] | None = None, metric: Callable | None = None, schema: dict | None = None,
                 max_new_tokens: int = 32, paged_config: PagedConfig | None = None,
                 prefix: str = "eval_generation", distributed: bool | None = None) -> None:
        if not prompts:
            raise ValueError("PagedGenerationCallback needs at least one prompt")
        if references is not None and len(references) != len(prompts):
            raise ValueError(f"got {len(references)} references for {len(prompts)} prompts; give one each")
        if isinstance(prompts[0], str) is False and not isinstance(prompts[0], (list, tuple)):
            raise TypeError("prompts must be strings or lists of token ids")
        self.prompts = list(prompts)
        self.tokenizer = tokenizer
        self.references = references
        self.schema = schema
        if metric is None:
            if references is not None:
                metric = exact_match
            elif schema is not None:

                def metric(texts, refs):
                    return json_validity(texts, refs, schema)

                metric.__name__ = "json_validity"
        self.metric = metric
        self.max_new_tokens = max_new_tokens
        self.paged_config = paged_config
        self.prefix = prefix
        self.distributed = distributed
        self.history: list[dict] = []

    def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
        if model is None:
            return control
        tokenizer = self.tokenizer or kwargs.get("processing_class") or kwargs.get("tokenizer")
        logs = self.evaluate(model, tokenizer, step=state.global_step)
        if metrics is not None:
            metrics.update(logs)
        state.log_history.append({**logs, "step": state.global_step})
        return control

    def evaluate(self, model: torch.nn.Module, tokenizer=None, step: int = 0) -> dict[str, float]:
        """Generate, score, and return the values to log (also usable outside a Trainer)."""
        from hf_paged import SamplingParams, engine_of, is_wrapped, unwrap, wrap

        prompt_ids = [self._encode(p, tokenizer) for p in self.prompts]
        was_training, was_wrapped = model.training, is_wrapped(model)
        processors = []
        if self.schema is not None:
            from hf_paged.processors import JSONSchemaLogitsProcessor

            processors = [JSONSchemaLogitsProcessor(self.schema, tokenizer)]
        eos = model.generation_config.eos_token_id
        params = SamplingParams(max_new_tokens=self.max_new_tokens, eos_token_id=eos, logits_processors=processors)
        model.eval()
        try:
            with original_forward(model):  # (ambient autocast: the engine's forwards turn it off)
                if not was_wrapped:
                    wrap(model, self.paged_config)
                if self._spread():
                    run = run_sharded(model, prompt_ids, sampling_params=params)
                    outputs, seconds, per_rank = run.outputs, max(run.seconds), list(run.engine_stats)
                else:
                    start = time.perf_counter()
                    outputs = model.generate_batch(prompt_ids, sampling_params=params)
                    seconds, per_rank = time.perf_counter() - start, None
                stats = engine_of(model).stats()
        finally:
            if not was_wrapped:
                unwrap(model)
            model.train(was_training)
        for i, output in enumerate(outputs.values()):
            if output.error is not None:
                raise RequestFailedError(f"PagedGenerationCallback: the generation for prompt {i} failed at step "
                                         f"{step}: {output.error}")
        tokens = [o.generated_tokens for o in outputs.values()]
        texts = [tokenizer.decode(t, skip_special_tokens=True) for t in tokens] if tokenizer is not None else \
            [" ".join(map(str, t)) for t in tokens]
        logs = {f"{self.prefix}_tokens_per_s": sum(map(len, tokens)) / max(seconds, 1e-9)}
        if self.metric is not None:
            value = self.metric(texts, self.references)
            values = value if isinstance(value, dict) else {getattr(self.metric, "__name__", "metric"): value}
            logs.update({f"{self.prefix}_{k}": float(v) for k, v in values.items()})
        entry = {"step": step, "texts": texts, "tokens": tokens, "metrics": dict(logs), "engine_stats": stats}
        if per_rank is not None:
            entry["engine_stats_by_rank"] = per_rank
        self.history.append(entry)
        return logs

    def _spread(self) -> bool:
        if self.distributed is not None:
            return self.distributed
        return world()[1] > 1

    @staticmethod
    def _encode(prompt, tokenizer) -> list[int]:
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer: pass tokenizer= to PagedGenerationCallback")
            return tokenizer(prompt)["input_ids"]
        return [int(t) for t in prompt]
