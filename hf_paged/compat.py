"""Every use of another library's private API, in one place, with the versions it was checked against.

A private name can change in any release. Each function here wraps one, says what it does in the library's terms,
and `tests/test_compat.py` checks each entry against the installed versions, so an upgrade that breaks one fails
that test by name instead of a forward somewhere deep in the engine. Nothing else in hf_paged touches another
library's underscore names (`tests/test_compat.py::test_private_names_only_here` reads the source).

    library       checked with   entries
    transformers  5.25.0         prepare_generation_config, prepare_special_tokens, stock_stopping_criteria,
                                 stock_logits_processors, get/set_attn_implementation, has_attn_implementation,
                                 plain_decoder (`TokenizersBackend._decode`'s Rust call, without the Python around it)
    torch         2.13.0         module_is_hooked, global_forward_hooks
    numba         0.68.1         numba_cache_index
    accelerate    1.16.0         execution_device (its hooks' `_hf_hook.execution_device`)

The library imports happen inside the functions: this module is a leaf any layer may import.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "CHECKED_WITH",
    "compiled_in_place",
    "execution_device",
    "forward_hook_keys",
    "get_attn_implementation",
    "global_forward_hooks",
    "has_attn_implementation",
    "has_default_max_length",
    "module_is_hooked",
    "numba_cache_index",
    "plain_decoder",
    "prepare_generation_config",
    "prepare_special_tokens",
    "seal_numba_cache",
    "set_attn_implementation",
    "stock_logits_processors",
    "stock_max_length",
    "stock_stopping_criteria",
]

CHECKED_WITH = {"transformers": "5.25.0", "torch": "2.13.0", "numba": "0.68.1", "accelerate": "1.16.0"}


# -- transformers: GenerationMixin's preparation steps, so the engine builds exactly what stock generate builds ----
def prepare_generation_config(model: Any, generation_config: Any, **kwargs: Any) -> tuple[Any, dict]:
    """`GenerationMixin._prepare_generation_config`: the call's config (the model's defaults, the given config and
    keyword overrides merged) and the keywords left for the model."""
    return model._prepare_generation_config(generation_config, **kwargs)


def has_default_max_length(model: Any, generation_config: Any, kwargs: dict) -> bool:
    """`generate`'s `has_default_max_length`, read before the call's config is prepared: no `max_length` in the
    keywords, the given config or the model's."""
    return (kwargs.get("max_length") is None
            and (generation_config is None or generation_config.max_length is None)
            and model.generation_config.max_length is None)


def stock_max_length(model: Any, generation_config: Any, default_max_length: bool, input_ids_length: int) -> int:
    """The `max_length` stock generate runs to (`_prepare_generated_length`: with no max_length anywhere, 20 new
    tokens within `max_position_embeddings`), checked as stock checks it (`_validate_generated_length`: a prompt at
    or past it is stock's ValueError, with stock's warnings). `generation_config` is left as it was."""
    config = copy.deepcopy(generation_config)
    model._prepare_generated_length(config, default_max_length, True, "input_ids", input_ids_length, None)
    model._validate_generated_length(config, input_ids_length, default_max_length)
    return config.max_length


def prepare_special_tokens(model: Any, generation_config: Any, device: Any) -> None:
    """`GenerationMixin._prepare_special_tokens`: EOS/BOS/pad ids as tensors on `device`, in place, as stock
    generate does before it builds its processors and criteria (with an attention mask given)."""
    model._prepare_special_tokens(generation_config, kwargs_has_attention_mask=True, device=device)


def stock_stopping_criteria(model: Any, generation_config: Any, stopping_criteria: Any, tokenizer: Any) -> Any:
    """`GenerationMixin._get_stopping_criteria`: the `StoppingCriteriaList` stock generate builds (length, time,
    stop strings, EOS) merged with the caller's."""
    return model._get_stopping_criteria(generation_config=generation_config, stopping_criteria=stopping_criteria,
                                        tokenizer=tokenizer)


def stock_logits_processors(model: Any, generation_config: Any, input_ids_seq_length: int, user_processors: Any,
                            device: Any) -> Any:
    """`GenerationMixin._get_logits_processor`: the `LogitsProcessorList` stock generate builds for a prompt of
    `input_ids_seq_length` tokens, merged with the caller's."""
    return model._get_logits_processor(generation_config=generation_config, input_ids_seq_length=input_ids_seq_length,
                                       encoder_input_ids=None, prefix_allowed_tokens_fn=None,
                                       logits_processor=user_processors, device=device, model_kwargs={})


# -- transformers: the attention implementation a config holds, read at every forward ----------------------------
def has_attn_implementation(config: Any) -> bool:
    """Whether `config` holds an attention implementation of its own (`PreTrainedConfig._attn_implementation_internal`;
    the public `_attn_implementation` property resolves defaults and would not tell)."""
    return hasattr(config, "_attn_implementation_internal")


def get_attn_implementation(config: Any) -> str | None:
    """The name `config` holds (None: transformers picks its default)."""
    return config._attn_implementation_internal


def set_attn_implementation(config: Any, name: str | None) -> None:
    """Set the name without the checks and sub-config propagation of `PreTrainedModel.set_attn_implementation`
    (the engine switches for one forward, on every config the modules read, and restores each afterwards)."""
    config._attn_implementation_internal = name


# -- torch: whether a module's forward may be bypassed -------------------------------------------------------------
def module_is_hooked(module: Any) -> bool:
    """Forward hooks, pre-hooks, a per-instance `forward`, or `module.compile()` (`nn.Module._forward_hooks`,
    `_forward_pre_hooks`, `_compiled_call_impl`)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
                or module._compiled_call_impl is not None)


def compiled_in_place(module: Any) -> bool:
    """`module.compile()` (`nn.Module._compiled_call_impl`), or a per-instance `forward` made by `torch.compile`
    (transformers' documented `model.forward = torch.compile(model.forward)`; dynamo marks it with
    `_torchdynamo_orig_callable`)."""
    return module._compiled_call_impl is not None or hasattr(module.__dict__.get("forward"),
                                                             "_torchdynamo_orig_callable")


def forward_hook_keys(module: Any) -> tuple:
    """What runs around `module`'s forward, as comparable keys: its hooks' and pre-hooks' handle ids, the identity of
    a per-instance `forward`, whether it was compiled in place (`nn.Module._forward_hooks`, `_forward_pre_hooks`,
    `_compiled_call_impl`). Empty for a plain module."""
    if not (module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
            or module._compiled_call_impl is not None):
        return ()
    return (tuple(module._forward_hooks), tuple(module._forward_pre_hooks), id(module.__dict__.get("forward")),
            module._compiled_call_impl is not None)


def global_forward_hooks() -> bool:
    """Whether any process-wide forward hook is registered (`torch.nn.modules.module._global_forward_hooks`,
    `_global_forward_pre_hooks`: `register_module_forward_hook` has no public reader)."""
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks)


# -- accelerate: where a model with offloaded weights computes ------------------------------------------------------
def execution_device(model: Any) -> Any:
    """The device `model` computes on: its first parameter's that holds data, or, where accelerate offloads every
    weight (`cpu_offload`, `disk_offload`, `device_map` with "cpu"/"disk" entries: parameters on the meta device,
    loaded by the hooks around each module's forward), the execution device of the first hook that names one
    (`module._hf_hook.execution_device`). The meta device when neither is known."""
    import torch

    meta = None
    for param in model.parameters():
        if param.device.type != "meta":
            return param.device
        meta = param.device
    for module in model.modules():
        device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
        if device is not None:
            return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return meta if meta is not None else torch.device("cpu")


# -- numba: what its on-disk cache holds -------------------------------------------------------------------------
def numba_cache_index(dispatcher: Any) -> dict:
    """The index of a `njit(cache=True)` function's on-disk cache (`Dispatcher._cache._cache_file._load_index`):
    {(signature, codegen magic tuple, code hashes): file} (numba 0.68; read a key's first two items). Empty when nothing is cached or the internals moved: a caller reads
    that as "not cached", which only costs a compile in a child process."""
    try:
        return dict(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 -- internal API: any surprise reads as "not cached"
        return {}


def seal_numba_cache(dispatchers: Any, salt: str) -> None:
    """Make the on-disk cache of each `njit(cache=True)` function among `dispatchers` (other objects are skipped)
    valid only for `salt` too. numba keeps a cache while its own file's modification time and size
    (`Dispatcher._cache._cache_file._source_stamp`) stay the same, so an edited helper in another module (inlined
    into it) left a stale binary that crashed or gave wrong numbers; the salt, a digest of every file its family
    compiles from, goes into that stamp. Idempotent."""
    for dispatcher in dispatchers:
        if not hasattr(dispatcher, "py_func"):
            continue
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
        stamp = getattr(cache_file, "_source_stamp", None)
        if stamp is not None and not (isinstance(stamp, tuple) and stamp[-1:] == (salt,)):
            cache_file._source_stamp = (stamp, salt)


# -- torch: a module's own tensors -----------------------------------------------------------------------------------
def own_parameters_and_buffers(module: Any) -> tuple[list, list]:
    """The parameters and buffers registered on `module` itself, not its children (`nn.Module._parameters`,
    `_buffers`: one walk of a model's modules reads both, where `parameters()` and `buffers()` walk it twice)."""
    return ([t for t in module._parameters.values() if t is not None],
            [t for t in module._buffers.values() if t is not None])


# -- Python: a regex's parse tree ------------------------------------------------------------------------------------
def regex_parse_tree(pattern: str) -> Any:
    """`re._parser.parse(pattern)` (Python 3.11+; `sre_parse` before): a list of (opcode, argument) pairs. Raises
    `re.error` for a pattern Python cannot read."""
    import re._parser as sre_parse

    return sre_parse.parse(pattern)


# -- transformers: a fast tokenizer's decode without the Python around it ---------------------------------------------
def plain_decoder(tokenizer: Any) -> Any:
    """The Rust tokenizer (`backend_tokenizer`) whose `decode(ids, skip_special_tokens=...)` is all that
    `tokenizer.decode` runs, or None: a `TokenizersBackend` that overrides neither `decode` nor `_decode` (in its
    class or on the object), with no space clean-up to apply (`_decode` skips it for a BPE model). The Python around
    the Rust call (converting every id, the batch check, the clean-up check) cost ~7x the decode in the stop-string
    check, which runs for every token of every request with stop strings. (The backend holds no reference to
    `tokenizer`: memoise it freely.)"""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    cls = type(tokenizer)
    if not (isinstance(tokenizer, TokenizersBackend) and cls.decode is PreTrainedTokenizerBase.decode
            and cls._decode is TokenizersBackend._decode and "decode" not in vars(tokenizer)):
        return None
    backend = tokenizer.backend_tokenizer
    if tokenizer.clean_up_tokenization_spaces and not (
            type(backend.model).__name__ == "BPE"
            and not getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)):
        return None
    return backend
