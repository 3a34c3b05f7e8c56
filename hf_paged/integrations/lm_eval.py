"""`PagedLM`: lm-evaluation-harness's model `hf-paged` (registered when this module is imported; `hf-paged eval`).

    lm-eval run --model hf --model_args pretrained=PATH --tasks T        # lm-eval's HF backend, padded batches
    hf-paged eval --model_args pretrained=PATH --tasks T                 # the same evaluation on the paged engine

A subclass of lm-eval's own `HFLM`: loading, tokenization, BOS handling, left truncation, chat templates and the
sharding of requests over ranks (`accelerate launch` / `torchrun`) are HFLM's, so prompts are token for token the
ones `--model hf` builds. What changes is how they run: all of a task's requests go to the engine at once
(`generate_until` through `generate_batch`, each request with its `until` as stop strings and `max_gen_toks` as its
own budget; `loglikelihood` and `loglikelihood_rolling` through `hf_paged.api.scoring`, where the choices of one
context share its blocks) instead of HFLM's padded batches of `batch_size`.

    PagedLM(pretrained="path/or/hub-id" | loaded model, tokenizer=None, **hf_and_paged_args)
      hf_and_paged_args: HFLM's own arguments (dtype, device, max_length, add_bos_token, ...; `batch_size` is
      accepted and unused) and PagedConfig fields (block_size, num_blocks, max_num_batched_tokens, ...); any other
      name raises InvalidConfigError naming it. Unless given, `max_num_batched_tokens` is raised to `max_length`
      (at most 4x its default): a rolling window then runs in one step, one causal attention, as HFLM's batch of
      one runs it.
"""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from typing import Any

import torch
import torch.distributed as dist
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

import hf_paged
from hf_paged.api.loading import missing_model_path
from hf_paged.api.scoring import loglikelihood, loglikelihood_rolling
from hf_paged.batching.request import RequestStatus
from hf_paged.config import PagedConfig
from hf_paged.distributed import world
from hf_paged.errors import InvalidConfigError, RequestFailedError, UnsupportedModelError

__all__ = ["PagedLM"]

_PAGED_FIELDS = frozenset(f.name for f in fields(PagedConfig))
_HFLM_ARGS = frozenset(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs"}
# passed on to `from_pretrained` by HFLM, as `--model hf` takes them
_FROM_PRETRAINED = frozenset({"attn_implementation", "low_cpu_mem_usage", "local_files_only", "cache_dir",
                              "torch_dtype", "device_map"})


@register_model("hf-paged")
class PagedLM(HFLM):
    """lm-eval's HF model with every request on hf_paged's engine; see the module docstring."""

    def __init__(self, pretrained=None, tokenizer=None, **kwargs: Any) -> None:
        if pretrained is None:
            raise InvalidConfigError("hf-paged needs the model to evaluate: pretrained=PATH (a model directory or a "
                                     "hub id) in --model_args, or PagedLM(pretrained=<path or loaded model>)")
        if isinstance(pretrained, str) and missing_model_path(pretrained):
            raise InvalidConfigError(f"model {pretrained!r} not found: give pretrained= a model directory or a hub id")
        paged = {name: kwargs.pop(name) for name in list(kwargs) if name in _PAGED_FIELDS}
        unknown = sorted(set(kwargs) - _HFLM_ARGS - _FROM_PRETRAINED)
        if unknown:
            raise InvalidConfigError(
                f"unknown model argument(s) {unknown} for hf-paged: it takes lm-eval's hf arguments "
                f"({', '.join(sorted(_HFLM_ARGS))}) and PagedConfig fields ({', '.join(sorted(_PAGED_FIELDS))})"
            )
        config = PagedConfig(**paged)  # bad values raise here, before a model is loaded
        self._model_was_given = not isinstance(pretrained, str)  # HFLM then assumes one process; so do we
        super().__init__(pretrained=pretrained, tokenizer=tokenizer, **kwargs)
        if self.backend != "causal":
            raise UnsupportedModelError("hf-paged evaluates decoder-only models; use --model hf for seq2seq ones")
        if "max_num_batched_tokens" not in paged:
            config = replace(config, max_num_batched_tokens=_window_budget(config.max_num_batched_tokens,
                                                                           self.max_length))
        hf_paged.wrap(self.model, config)
        self._join_ranks()
        hf_paged.engine_of(self.model)  # built with the model, as HFLM loads it (pool, the lean forward's self-check)

    # -- several processes ---------------------------------------------------------------------------------------
    def _join_ranks(self) -> None:
        """Under `accelerate launch` / `torchrun`, each rank takes its share of the requests as HFLM's data parallel
        mode does, on CPUs too (HFLM shards only over several GPUs of one machine; on CPU every rank would run
        everything): lm-eval's evaluator shards the instances by `rank` and gathers samples and metrics on rank 0."""
        if self._world_size > 1 or self._model_was_given:
            return
        rank, size = world()  # (a torchrun / accelerate launch job not yet initialised: gloo through accelerate)
        if size > 1:
            self._rank, self._world_size = rank, size

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size <= 1 or getattr(self, "accelerator", None) is not None:
            return super().all_gather(tensor)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def barrier(self) -> None:
        if self.world_size <= 1 or getattr(self, "accelerator", None) is not None:
            super().barrier()
        else:
            dist.barrier()

    # -- log-likelihoods ---------------------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None) -> list[tuple[float, bool]]:
        """HFLM's truncation (the last max_length + 1 tokens of context + continuation), all pairs in one call."""
        pairs = []
        for _, context_enc, continuation_enc in requests:
            whole = (list(context_enc) + list(continuation_enc))[-(self.max_length + 1):]
            num_scored = min(len(continuation_enc), len(whole) - 1)
            pairs.append((whole[: len(whole) - num_scored], whole[len(whole) - num_scored:]))
        results = loglikelihood(self.model, pairs, progress_bar=self._bar(disable_tqdm))
        answers = [(r.logprob, r.is_greedy) for r in results]
        for (request_str, _, _), answer in zip(requests, answers):
            if request_str is not None:
                self.cache_hook.add_partial("loglikelihood", request_str, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        documents = [self.tok_encode(request.args[0]) for request in requests]
        nonempty = [d for d in documents if d]
        scored = iter(loglikelihood_rolling(self.model, nonempty, max_length=self.max_length,
                                            prefix_token_id=self.prefix_token_id,
                                            progress_bar=self._bar(disable_tqdm)))
        totals = [next(scored).logprob if d else 0.0 for d in documents]  # an empty document has no window: 0
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (request.args[0],), total)
        return totals

    # -- generation --------------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Every request of each distinct `gen_kwargs` in one `generate_batch` (a task has one); text cut at the
        first stop sequence as HFLM cuts it."""
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items(), key=lambda kv: kv[0])), []).append(i)
        results: list[str | None] = [None] * len(requests)
        for indices in groups.values():
            gen_kwargs = requests[indices[0]].args[1]
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            kwargs.pop("max_length", None)  # HFLM's padded-batch length: each request has max_gen_toks instead
            _greedy_unless_asked(kwargs)
            contexts = [requests[i].args[0] for i in indices]
            prompts = [self._encode_context(c, self.max_length - max_gen_toks) for c in contexts]
            outputs = self.model.generate_batch(prompts, max_new_tokens=max_gen_toks, stop_strings=until,
                                                tokenizer=self.tokenizer, progress_bar=self._bar(disable_tqdm),
                                                **kwargs)
            for i, context, output in zip(indices, contexts, outputs.values()):
                if output.status is not RequestStatus.FINISHED:
                    raise RequestFailedError(f"generate_until request {i} failed: {output.error}")
                text = self._postprocess(output.generated_tokens, until)
                results[i] = text
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return results

    def _encode_context(self, context: str, max_context_len: int) -> list[int]:
        if max_context_len <= 0:
            raise InvalidConfigError(
                f"max_gen_toks leaves no room for a prompt within max_length={self.max_length}: lower max_gen_toks"
            )
        ids, _ = self.tok_batch_encode([context], left_truncate_len=max_context_len, truncation=self.truncation)
        return ids[0].tolist()

    def _postprocess(self, tokens: list[int], until: list[str]) -> str:
        think_end = self.think_end_token
        if isinstance(think_end, int):
            marks = [k for k, t in enumerate(tokens) if t == think_end]
            if marks:
                tokens = tokens[marks[-1] + 1:]
        text = self.tok_decode(tokens)
        if isinstance(think_end, int):
            text = text.lstrip()
        return postprocess_generated_text(generation=text, stop=until,
                                          think_end_token=think_end if isinstance(think_end, str) else None)

    def _bar(self, disable_tqdm: bool) -> bool:
        return not disable_tqdm and self.rank == 0


def _window_budget(default: int, max_length: int) -> int:
    """The step budget when none is given: a scored window of `max_length` tokens fits one step, so it is not split
    into chunks whose later one attends with an explicit mask over the whole context (on the CPU ~1.4x the work of
    the one causal attention HFLM runs); at most 4x the default, so a step's logits rows (a rolling window's are all
    scored) stay within 4x the default's whatever the model's positions."""
    return max(default, min(max_length, 4 * default))


def _greedy_unless_asked(kwargs: dict) -> None:
    """HFLM's defaults: temperature 0 unless given, and temperature 0 means greedy."""
    kwargs["temperature"] = kwargs.get("temperature", 0.0)
    if kwargs["temperature"] == 0.0 and kwargs.get("do_sample") is None:
        kwargs["do_sample"] = False
    if kwargs.get("do_sample") is False and kwargs["temperature"] == 0.0:
        kwargs.pop("temperature")
