"""`PagedLM`: lm-evaluation-harness's model `hf-paged` (registered when this module is imported; `hf-paged eval`).

    lm-eval run --model hf --model_args pretrained=PATH --tasks T        # lm-eval's HF backend, padded batches
    hf-paged eval --model_args pretrained=PATH --tasks T                 # the same evaluation on the paged engine

A subclass of lm-eval's own `HFLM`: loading, tokenization, BOS handling, left truncation, chat templates and the
sharding of requests over ranks (`accelerate launch` / `torchrun`) are HFLM's, so prompts are token for token the
ones `--model hf` builds. What changes is how they run: all of a task's requests go to the engine at once
(`generate_until` through `generate_batch`, each request with its `until` as stop strings and `max_gen_toks` as its
own budget; `loglikelihood` and `loglikelihood_rolling` through `hf_paged.api.scoring`, where the choices of one
context share its blocks) instead of HFLM's padded batches of `batch_size`. Where HFLM refuses or answers without
the model, so does PagedLM: an empty continuation is (0.0, True); one longer than `max_length` raises
`ContinuationTooLongError` naming its task and document. A sampled generate_until request gets its own seed
(`request_seeds`), so its draws do not depend on what else the engine runs.

    PagedLM(pretrained="path/or/hub-id" | loaded model, tokenizer=None, **hf_and_paged_args)
      hf_and_paged_args: HFLM's own arguments (dtype, device, max_length, add_bos_token, ...; `batch_size` is
      accepted and unused) and PagedConfig fields (block_size, num_blocks, max_num_batched_tokens, ...); any other
      name raises InvalidConfigError naming it. Unless given, `max_num_batched_tokens` is raised to `max_length`
      (at most 4x its default): a rolling window then runs in one step, one causal attention, as HFLM's batch of
      one runs it.
"""

from __future__ import annotations

import hashlib
import inspect
from collections import Counter
from dataclasses import fields, replace
from typing import Any

import torch
import torch.distributed as dist

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
except ImportError as exc:
    raise ImportError(f"hf_paged.integrations.lm_eval needs the eval extra, lm-eval>=0.4.13,<0.5 ({exc}): "
                      "pip install 'hf_paged[eval]'") from None

import hf_paged
from hf_paged.api.loading import missing_model_path
from hf_paged.api.scoring import loglikelihood, loglikelihood_rolling
from hf_paged.batching.request import RequestStatus
from hf_paged.config import PagedConfig
from hf_paged.distributed import world
from hf_paged.errors import InvalidConfigError, PromptTooLongError, RequestFailedError, UnsupportedModelError

__all__ = ["ContinuationTooLongError", "PagedLM"]

_PAGED_FIELDS = frozenset(f.name for f in fields(PagedConfig))
_HFLM_ARGS = frozenset(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs"}
# passed on to `from_pretrained` by HFLM, as `--model hf` takes them
_FROM_PRETRAINED = frozenset({"attn_implementation", "low_cpu_mem_usage", "local_files_only", "cache_dir",
                              "torch_dtype", "device_map"})
# PagedConfig fields that take an integer (lm-eval's CLI reads `num_blocks=-1` as the float -1.0)
_INT_FIELDS = frozenset(f.name for f in fields(PagedConfig)
                        if "int" in {t.strip() for t in str(f.type).split("|")} and "float" not in str(f.type))
_DTYPE_ARGS = ("dtype", "torch_dtype", "softmax_dtype", "mixed_precision_dtype")


class ContinuationTooLongError(PromptTooLongError):
    """A loglikelihood continuation longer than `max_length`: no window of the model holds all of it (lm-eval's hf
    refuses it too); `index` is its place in the requests given."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


@register_model("hf-paged")
class PagedLM(HFLM):
    """lm-eval's HF model with every request on hf_paged's engine; see the module docstring."""

    def __init__(self, pretrained=None, tokenizer=None, **kwargs: Any) -> None:
        paged, config = check_model_arguments(pretrained, kwargs)
        self._model_was_given = not isinstance(pretrained, str)  # HFLM then assumes one process; so do we
        super().__init__(pretrained=pretrained, tokenizer=tokenizer, **kwargs)
        if self.backend != "causal":
            raise UnsupportedModelError("hf-paged evaluates decoder-only models; use --model hf for seq2seq ones")
        _refuse_offloaded(self.model, kwargs)
        if "max_num_batched_tokens" not in paged:
            config = replace(config, max_num_batched_tokens=_window_budget(config.max_num_batched_tokens,
                                                                           self.max_length))
        hf_paged.wrap(self.model, config)
        self._join_ranks()
        # built with the model, as HFLM loads it (pool, the lean forward's self-check)
        self._fit_max_length(hf_paged.engine_of(self.model).max_model_len)

    def _fit_max_length(self, limit: int) -> None:
        """A max_length past the model's positions is refused when given (the engine runs no position past them: a
        generation would end there, a longer context could not be scored; HFLM runs RoPE past them); a derived one
        (the tokenizer's model_max_length, lm-eval's default 2048) becomes the model's own."""
        if self.max_length > limit:
            if self._max_length:
                hf_paged.unwrap(self.model)  # (a model the caller gave goes back as it came)
                raise InvalidConfigError(f"max_length={self.max_length} is more than the model's {limit} positions, "
                                         f"which hf-paged never runs past: pass max_length <= {limit}")
            self._max_length = limit

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
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """HFLM's (lm-eval's tokenization), with an empty continuation scored (0.0, True) even after an empty
        context (where lm-eval's own tokenization fails), and a continuation too long for the model named by its
        task and document."""
        answers: list[tuple[float, bool] | None] = [None] * len(requests)
        todo = [i for i, request in enumerate(requests) if tuple(request.args) != ("", "")]
        for i in set(range(len(requests))) - set(todo):
            answers[i] = (0.0, True)
            self.cache_hook.add_partial("loglikelihood", tuple(requests[i].args), answers[i])
        try:
            scored = super().loglikelihood([requests[i] for i in todo], disable_tqdm=disable_tqdm)
        except ContinuationTooLongError as exc:
            request = requests[todo[exc.index]]
            raise ContinuationTooLongError(f"{_name(request, todo[exc.index])} (continuation "
                                           f"{request.args[1][:60]!r}): {exc}", index=todo[exc.index]) from None
        for i, answer in zip(todo, scored, strict=True):
            answers[i] = answer
        return answers

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None) -> list[tuple[float, bool]]:
        """HFLM's truncation (the last max_length + 1 tokens of context + continuation), all pairs in one call. An
        empty continuation is (0.0, True) as HFLM answers it (nothing scored: no call); a continuation longer than
        max_length raises `ContinuationTooLongError`, as HFLM refuses it, rather than scoring only its end."""
        answers: list[tuple[float, bool] | None] = [None] * len(requests)
        pairs, scored = [], []
        for i, (_, context_enc, continuation_enc) in enumerate(requests):
            if not continuation_enc:
                answers[i] = (0.0, True)
                continue
            if len(continuation_enc) > self.max_length:
                raise ContinuationTooLongError(
                    f"the continuation has {len(continuation_enc)} tokens and max_length is {self.max_length}: no "
                    f"window of the model holds it, so it cannot be scored whole (lm-eval's hf refuses it too); raise "
                    f"max_length up to the model's positions, or shorten the choice", index=i)
            whole = (list(context_enc) + list(continuation_enc))[-(self.max_length + 1):]
            num_scored = len(continuation_enc)
            pairs.append((whole[: len(whole) - num_scored], whole[len(whole) - num_scored:]))
            scored.append(i)
        results = loglikelihood(self.model, pairs, progress_bar=self._bar(disable_tqdm)) if pairs else []
        for i, result in zip(scored, results, strict=True):
            answers[i] = (result.logprob, result.is_greedy)
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
        first stop sequence as HFLM cuts it. A sampled request draws from its own generator, seeded by
        `request_seeds` from lm-eval's torch seed and the request's place in its task, so its text does not depend
        on the other tasks of the run or on the engine's schedule."""
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items(), key=lambda kv: kv[0])), []).append(i)
        results: list[str | None] = [None] * len(requests)
        seeds = request_seeds(requests, torch.initial_seed())
        for indices in groups.values():
            gen_kwargs = requests[indices[0]].args[1]
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            name = _name(requests[indices[0]], indices[0])
            if not all(isinstance(stop, str) for stop in until):
                raise InvalidConfigError(f"generate_until {name}: until must be a string or a list of strings, got "
                                         f"{gen_kwargs.get('until')!r}")
            if max_gen_toks < 1:
                raise InvalidConfigError(f"generate_until {name}: max_gen_toks must be >= 1, got {max_gen_toks}")
            kwargs.pop("max_length", None)  # HFLM's padded-batch length: each request has max_gen_toks instead
            _greedy_unless_asked(kwargs)
            contexts = [requests[i].args[0] for i in indices]
            prompts = [self._encode_context(c, self.max_length - max_gen_toks) for c in contexts]
            options = {"max_new_tokens": max_gen_toks, "stop_strings": until, "tokenizer": self.tokenizer, **kwargs}
            if kwargs.get("do_sample"):  # each request its own seed: its samples whatever else runs in the step
                options = {"sampling_params": _seeded(self.model, prompts, options,
                                                      [seeds[i] for i in indices])}
            outputs = self.model.generate_batch(prompts, progress_bar=self._bar(disable_tqdm), **options)
            for i, context, output in zip(indices, contexts, outputs.values()):
                if output.status is not RequestStatus.FINISHED:
                    raise RequestFailedError(f"generate_until {_name(requests[i], i)} failed: {output.error}")
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


def request_seeds(requests, seed: int) -> list[int]:
    """One seed per generate_until request: blake2b of (lm-eval's torch seed, task name, document id, the request's
    index within its document, the repeat: lm-eval passes a request `repeats` times). A request without a task
    (a direct call) is keyed by its place in the list."""
    seen: Counter = Counter()
    seeds = []
    for position, request in enumerate(requests):
        task = getattr(request, "task_name", None)
        key = (task, request.doc_id, request.idx) if task is not None else (None, position, 0)
        repeat = seen[key]
        seen[key] += 1
        digest = hashlib.blake2b(repr((seed, *key, repeat)).encode(), digest_size=8).digest()
        seeds.append(int.from_bytes(digest, "big") >> 1)  # SamplingParams.seed: below 2**63
    return seeds


def _name(request, position: int) -> str:
    """A request as its task names it ("task 'arc', document 7, request 2"); a bare one by its place in the list."""
    if getattr(request, "task_name", None) is None:
        return f"request {position}"
    return f"task {request.task_name!r}, document {request.doc_id}, request {request.idx}"


def _seeded(model, prompts: list[list[int]], options: dict, seeds: list[int]) -> list:
    """`generate_batch`'s own translation of these options per prompt (`sampling_params_for`), each with its seed."""
    from hf_paged.api.generate import sampling_params_for

    per_prompt = sampling_params_for(model, prompts, None, None, None, dict(options))
    return [params.replace(seed=seed) for params, seed in zip(per_prompt, seeds, strict=True)]


def check_model_arguments(pretrained, kwargs: dict) -> tuple[dict, PagedConfig]:
    """Every refusal PagedLM makes before it loads a model, each naming the argument: no or a missing `pretrained`,
    an unknown name, a non-integer count, a bad dtype or device, a PagedConfig value out of range. Takes the
    PagedConfig fields out of `kwargs` (the rest are HFLM's); returns them and their config. `hf-paged eval` calls it
    on the command line's arguments before lm-eval indexes its tasks (~10 s), so a typo fails at once."""
    if pretrained is None:
        raise InvalidConfigError("hf-paged needs the model to evaluate: pretrained=PATH (a model directory or a "
                                 "hub id) in --model_args, or PagedLM(pretrained=<path or loaded model>)")
    if isinstance(pretrained, str) and missing_model_path(pretrained):
        raise InvalidConfigError(f"model {pretrained!r} not found: give pretrained= a model directory or a hub id")
    paged = {name: _integral(name, kwargs.pop(name)) for name in list(kwargs) if name in _PAGED_FIELDS}
    unknown = sorted(set(kwargs) - _HFLM_ARGS - _FROM_PRETRAINED)
    if unknown:
        raise InvalidConfigError(
            f"unknown model argument(s) {unknown} for hf-paged: it takes lm-eval's hf arguments "
            f"({', '.join(sorted(_HFLM_ARGS))}) and PagedConfig fields ({', '.join(sorted(_PAGED_FIELDS))})"
        )
    _check_hf_arguments(kwargs)
    try:
        config = PagedConfig(**paged)  # bad values raise here, before a model is loaded
    except (TypeError, ValueError) as exc:
        raise InvalidConfigError(f"model arguments {paged}: {exc}") from None
    return paged, config


def _integral(name: str, value: Any) -> Any:
    """An integer PagedConfig field as an int: lm-eval's CLI reads `-1` as -1.0 (PagedConfig then names the range);
    a value that is no integer is refused here, naming the argument."""
    if name not in _INT_FIELDS or value is None or isinstance(value, int):  # (a bool: PagedConfig names it)
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if name == "block_size" and value == "auto":
        return value
    raise InvalidConfigError(f"model argument {name}={value!r}: an integer is wanted (e.g. {name}="
                             f"{PagedConfig.__dataclass_fields__[name].default or 16})")


def _check_hf_arguments(kwargs: dict) -> None:
    """What HFLM would fail on with a traceback (an AttributeError, an AssertionError, a TypeError), or only at the
    first request (a negative `max_length`, a `prefix_token_id` that is no integer, an `add_bos_token` that is no
    boolean), refused by name first. (A `prefix_token_id` past the vocabulary is refused once the model is loaded.)"""
    for name in ("max_length", "max_batch_size"):
        value = kwargs.get(name)
        if isinstance(value, float) and value.is_integer():  # (lm-eval's CLI reads -5 as -5.0)
            kwargs[name] = value = int(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InvalidConfigError(f"model argument {name}={value!r}: a positive integer is wanted (e.g. {name}="
                                     f"{2048 if name == 'max_length' else 64})")
    value = kwargs.get("prefix_token_id")  # (a TypeError inside the tokenizer at the first request)
    if isinstance(value, float) and value.is_integer():
        kwargs["prefix_token_id"] = value = int(value)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidConfigError(f"model argument prefix_token_id={value!r}: a token id is wanted, an integer >= 0 "
                                 "(e.g. the model's BOS id; leave it out to use the model's BOS, else EOS, id)")
    value = kwargs.get("add_bos_token")
    if value is not None and not isinstance(value, bool):
        if not (isinstance(value, int) and value in (0, 1)):
            raise InvalidConfigError(f"model argument add_bos_token={value!r}: True or False is wanted (e.g. "
                                     "add_bos_token=True)")
        kwargs["add_bos_token"] = bool(value)
    for name in _DTYPE_ARGS:
        value = kwargs.get(name)
        if isinstance(value, str) and value != "auto" and not isinstance(getattr(torch, value, None), torch.dtype):
            raise InvalidConfigError(f"model argument {name}={value!r} is not a torch dtype: use float32, bfloat16, "
                                     "float16 or auto")
    device = kwargs.get("device")
    if (isinstance(device, str) and device.startswith("cuda") and not kwargs.get("parallelize")
            and not torch.cuda.is_available()):
        raise InvalidConfigError(f"device {device!r}, but this torch sees no CUDA device (torch "
                                 f"{torch.__version__}, CUDA build: {torch.version.cuda}): use --device cpu")


def _refuse_offloaded(model, kwargs: dict) -> None:
    """A model with parameters on the `meta` device (`parallelize=True` / `device_map` offloading to disk or CPU
    through accelerate hooks) cannot run on the engine, which reads weights and places its cache by their device."""
    offloaded = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if offloaded:
        given = {k: kwargs[k] for k in ("parallelize", "device_map", "max_memory_per_gpu", "max_cpu_memory",
                                        "offload_folder") if kwargs.get(k) not in (None, False)}
        raise UnsupportedModelError(
            f"hf-paged cannot evaluate a model offloaded by accelerate ({len(offloaded)} parameters on the meta "
            f"device, e.g. {offloaded[0]}; model arguments {given}): drop parallelize=True / device_map so that "
            "the model fits one device, or use --model hf for an offloaded model")
