"""`LeanForward`: a stock decoder's own torch ops, run without the module machinery around them.

At batch 1 a small model's step is mostly Python around its ops: module calls, decorators, kwargs plumbing,
the causal-mask builder and output recorders (a Llama layer of hidden 256 at batch 4: ~510 us through its modules,
~360 us of ops). For the families whose decoder layer is

    RMSNorm -> q/k/v projections -> RoPE -> attention -> o_proj -> + residual -> RMSNorm -> gated MLP -> + residual

(Llama, Qwen2, Mistral), `LeanForward` calls those ops itself, the same ops in the same order on the same
tensors, so its logits are the stock forward's bit for bit. It is built only when the modules it reads are plain
`nn.Linear` / `nn.Embedding` and the family's own classes, and a self-check agrees bit for bit with them: two probe
forwards (five tokens, then one) through the stock model and through this code, both with a probe attention that
records what it is given (every layer's q, k, v, scaling and sliding window); logits and records must be equal.
So an adapter, a patched or kernelized module, a module class we do not know, or a transformers release whose
modules compute differently keeps the stock forward; so do forward hooks, per-instance forwards (accelerate's
dispatch, tensor parallelism) and `module.compile()`, checked at each forward.

The last layer runs its o_proj, MLP and final norm on the rows whose logits are kept only (`prune`), where that
gives the same bits: fp32 on the CPU with one torch thread, where a matmul's row does not depend on the other rows
once there are at least `min_rows` (MKL takes other kernels below, so fewer kept rows are padded with other rows up
to it; measured per CPU by `row_kernels.py`: 4 on AVX2, 16 on AVX-512; with several threads the rows are split among
them and the rule breaks), and row widths that are
multiples of `_ROW_MULTIPLE` (elementwise ops never reach their scalar tail loop, whose transcendentals may round
otherwise). A prefill chunk's rows whose logits nobody reads then skip ~1/layers of the step's matmuls. The
self-check probes the pruned path too (built with one thread); where it disagrees, `prune` stays off.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import NamedTuple

import torch

from hf_paged.batching.row_kernels import independent_rows
from hf_paged.cache.attention_switch import attention_configs, own_attention, use_attention
from hf_paged.compat import global_forward_hooks, module_is_hooked

# model_type -> how its attention module passes `sliding_window` to the attention function
_FAMILIES: dict[str, Callable[[torch.nn.Module], int | None]] = {
    "llama": lambda attn: None,
    "qwen2": lambda attn: attn.sliding_window,
    "mistral": lambda attn: getattr(attn.config, "sliding_window", None),
}
_PROBE = "hf_paged_probe"
MIN_PRUNED_ROWS = 4  # the fewest rows pruned on any CPU (AVX2 MKL: rows of 1-3-row products differ); per CPU: min_rows
_ROW_MULTIPLE = 32  # two AVX-512 vectors: ATen's vectorized loops' step (their remainder runs scalar code)

Attend = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, float, "int | None"], torch.Tensor]


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float32:  # the stock casts to and from fp32 return `x` itself: skip their dispatch
        # in place on this function's own temporaries (`a * b` is `b * a` to the bit): fewer fresh tensors
        return (x * x.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon).rsqrt_()).mul_(norm.weight)
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`nn.Linear` on a contiguous [T, in]: the matmul `F.linear` runs for a contiguous [1, T, in] (its
    flattening to one `mm`, or `addmm` with a bias), without the dispatch around it."""
    if module.bias is None:
        return torch.mm(x, module.weight.t())
    return torch.addmm(module.bias, x, module.weight.t())


_HEAD_CHUNK = 1024  # vocabulary rows per matmul of `_head`: 2 MiB of a 512-wide fp32 weight, within a core's L2


def _head(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The lm_head's `_linear`, in slices of `_HEAD_CHUNK` vocabulary rows into one output (fp32 CPU, one torch
    thread, >= 2 rows, no bias, a vocabulary of >= 4 slices). MKL's one sgemm over a [50257, 512] weight packs the
    whole weight through memory at every call and runs at ~half its speed on 32-1024 rows (38 vs 27 ms at 32 rows
    here); slice by slice, each packed slice stays in cache. Each output element is the same dot product in the
    same order: bit-identical to the one `mm` (tests/batching/test_lean_head.py: 2-1024 rows, widths 64-512,
    vocabularies of 4,103-50,257)."""
    weight = module.weight
    vocab = weight.shape[0]
    if (module.bias is not None or x.shape[0] < 2 or vocab < 4 * _HEAD_CHUNK or weight.dtype != torch.float32
            or weight.device.type != "cpu" or torch.get_num_threads() != 1
            or (weight.requires_grad and torch.is_grad_enabled())):  # (`out=` has no autograd)
        return _linear(module, x)
    out = torch.empty(x.shape[0], vocab, dtype=x.dtype)
    # the last slice takes the remainder too: a product of a few columns (7 of them, say) takes another MKL path,
    # whose bits differ from the same columns of the one matmul
    starts = range(0, vocab - _HEAD_CHUNK + 1, _HEAD_CHUNK)
    for start, end in zip(starts, [*starts[1:], vocab]):
        torch.mm(x, weight[start:end].t(), out=out[:, start:end])
    return out


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """The stock `(x * cos) + (rotate_half(x) * sin)`: `rotate_half(x)` is `roll(x)` with its first half negated,
    and `-a * b` is `a * -b` to the bit, so the negation moves onto `sin` once per forward (`sin_signed`)."""
    return (x * cos).add_(x.roll(x.shape[-1] // 2, -1).mul_(sin_signed))  # in place on its own temporaries


class _Layer(NamedTuple):
    """The modules of one decoder layer that the lean forward reads, and its attention's sliding window."""

    in_norm: torch.nn.Module
    attn: torch.nn.Module
    q_proj: torch.nn.Module
    k_proj: torch.nn.Module
    v_proj: torch.nn.Module
    o_proj: torch.nn.Module
    window: int | None
    post_norm: torch.nn.Module
    gate: torch.nn.Module
    up: torch.nn.Module
    down: torch.nn.Module
    act: torch.nn.Module


class LeanForward:
    """`__call__(input_ids [1, T], position_ids [1, T], keep [R], attend)` -> logits `[R, vocab]`, where
    `attend(attn_module, q, k, v, scaling, sliding_window)` returns the attention output `[T, heads, dim]`
    (q `[T, heads, dim]`, k/v `[T, kv_heads, dim]` after RoPE). Every op is the stock module's on the same values
    (elementwise ops and row reductions give the same bits whatever the layout; the projections are the very
    `mm`/`addmm` that `F.linear` runs on the stock shape)."""

    def __init__(self, model: torch.nn.Module) -> None:
        base = model.model
        window = _FAMILIES[model.config.model_type]
        self.embed, self.rotary, self.norm, self.head = base.embed_tokens, base.rotary_emb, base.norm, model.lm_head
        self.layers = tuple(
            _Layer(layer.input_layernorm, layer.self_attn, layer.self_attn.q_proj, layer.self_attn.k_proj,
                   layer.self_attn.v_proj, layer.self_attn.o_proj, window(layer.self_attn),
                   layer.post_attention_layernorm, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj,
                   layer.mlp.act_fn)
            for layer in base.layers[: model.config.num_hidden_layers]
        )
        _check_classes(self, model)
        # every (module, its parent's child table, its name): a module swapped, hooked or given its own forward
        # after the build is seen by `usable`
        self._tree = tuple((child, parent._modules, name) for parent in model.modules()
                           for name, child in parent._modules.items() if child is not None)
        self._root = model
        self.prune = _prunable(model)  # the last layer after attention runs the kept rows only (module docstring)
        self.min_rows = _min_rows(self) if self.prune else None  # this CPU's row threshold (`row_kernels.py`)
        self.prune = self.min_rows is not None

    @classmethod
    def build(cls, model: torch.nn.Module) -> LeanForward | None:
        """The lean forward of `model`, or None where the stock forward must run (see the module docstring)."""
        if getattr(model.config, "model_type", None) not in _FAMILIES or not _plain(model):
            return None
        try:
            lean = cls(model)
        except (AttributeError, TypeError):  # a module of another shape under a known model_type
            return None
        if not lean.usable():
            return None
        for prune in (lean.prune, False) if lean.prune else (False,):  # a pruned path that disagrees: unpruned
            lean.prune = prune
            if _agrees(model, lean):
                return lean
        return None

    def usable(self) -> bool:
        """No module was swapped, hooked or given a per-instance forward since the build (the stock forward runs
        those); one pass over the module tree, no tensor work."""
        if module_is_hooked(self._root) or global_forward_hooks():
            return False
        return all(table.get(name) is m and not module_is_hooked(m) for m, table, name in self._tree)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
                 attend: Attend) -> torch.Tensor:
        return _head(self.head, self.hidden(input_ids, position_ids, keep, attend))

    def hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor,
               attend: Attend) -> torch.Tensor:
        """The final norm's output `[R, hidden]` on the kept rows: what the lm_head multiplies."""
        hidden = self.embed(input_ids[0])  # [T, hidden]: the stock [1, T, hidden] without its batch dimension
        cos, sin = self.rotary(hidden, position_ids)
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [T, 1, dim] against [T, heads, dim]
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        tokens = hidden.shape[0]
        rows = _pruned_rows(keep, tokens, self.min_rows) if self.prune and torch.get_num_threads() == 1 else None
        last = self.layers[-1].attn
        for in_norm, attn, q_proj, k_proj, v_proj, o_proj, window, post_norm, gate, up, down, act in self.layers:
            x = _rms_norm(in_norm, hidden)
            q = _linear(q_proj, x).view(tokens, -1, attn.head_dim)
            k = _linear(k_proj, x).view(tokens, -1, attn.head_dim)
            v = _linear(v_proj, x).view(tokens, -1, attn.head_dim)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            out = attend(attn, q, k, v, attn.scaling, window).reshape(tokens, -1)
            if rows is not None and attn is last:  # every layer stored its keys and values: the rest is per row
                out, hidden = out[rows], hidden[rows]
            # the residual adds and gate * up in place on the matmuls' fresh outputs (`a + b` is `b + a` to the
            # bit): a prefill step allocates (and malloc faults in) fewer [T, hidden] / [T, intermediate] tensors
            hidden = _linear(o_proj, out.contiguous()).add_(hidden)
            x = _rms_norm(post_norm, hidden)
            hidden = _linear(down, act(_linear(gate, x)).mul_(_linear(up, x))).add_(hidden)
        hidden = _rms_norm(self.norm, hidden)
        return hidden[keep] if rows is None else hidden[: keep.numel()]


def _pruned_rows(keep: torch.Tensor, tokens: int, min_rows: int = MIN_PRUNED_ROWS) -> torch.Tensor | None:
    """The rows the last layer runs after attention: `keep`, then other rows up to `min_rows`; None where that
    saves no row (a decode step keeps every row)."""
    count = max(keep.numel(), min_rows)
    if count >= tokens:
        return None
    if keep.numel() == count:
        return keep
    others = torch.ones(tokens, dtype=torch.bool, device=keep.device)
    others[keep] = False
    return torch.cat((keep, others.nonzero()[: count - keep.numel(), 0]))


def _check_classes(lean: LeanForward, model: torch.nn.Module) -> None:
    """Every module the lean forward reads is of the class it expects: plain `nn.Linear` / `nn.Embedding` (an
    adapter's or quantizer's replacement computes more than its `weight` says, even where a probe cannot tell, as
    a LoRA adapter whose B is still zero), the rest the family's own transformers modules (the MLP too: a subclass
    whose forward clamps or branches would be bypassed, and the probe's small activations may not show it)."""
    plain = [lean.embed, lean.head, *(m for x in lean.layers
                                      for m in (x.q_proj, x.k_proj, x.v_proj, x.o_proj, x.gate, x.up, x.down))]
    family = f"transformers.models.{model.config.model_type}."
    own = [model.model, lean.norm, lean.rotary, *model.model.layers,
           *(m for x in lean.layers for m in (x.in_norm, x.attn, x.post_norm)),
           *(layer.mlp for layer in model.model.layers)]  # (its gate, up, down and act are read, not its forward)
    if any(type(m) not in (torch.nn.Linear, torch.nn.Embedding) for m in plain) or any(
            not type(m).__module__.startswith(family) for m in own):
        raise TypeError("a module of another class")


def _min_rows(lean: LeanForward) -> int | None:
    """The fewest rows from which the last layer's products (and the certified head's slices) give a row the bits
    of a larger product on this CPU (`row_kernels.independent_rows`); None: no pruning."""
    last = lean.layers[-1]
    shapes = {(m.weight.shape[1], m.weight.shape[0]) for m in (last.o_proj, last.gate, last.up, last.down)}
    return independent_rows(shapes | {(lean.head.weight.shape[1], _HEAD_CHUNK)})


def _prunable(model: torch.nn.Module) -> bool:
    """fp32 on the CPU, one torch thread, and every row width of the layers' elementwise ops a multiple of
    `_ROW_MULTIPLE`."""
    config, weight = model.config, model.lm_head.weight
    widths = (config.hidden_size, config.intermediate_size)
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and torch.get_num_threads() == 1
            and all(isinstance(w, int) and w % _ROW_MULTIPLE == 0 for w in widths))


def _plain(model: torch.nn.Module) -> bool:
    """Parameters are plain tensors on one device (no tensor-parallel shards, no offload to meta)."""
    devices = set()
    for p in model.parameters():
        if type(p.data) is not torch.Tensor or p.device.type == "meta":
            return False
        devices.add(p.device)
    return len(devices) == 1


# -- the self-check ------------------------------------------------------------------------------------------------
class _Records(list):
    """The probe attention's records, in the lean layout [T, heads, dim]; its output depends on q only (k and v
    are compared through the records)."""

    def attend(self, attn, q, k, v, scaling, window) -> torch.Tensor:
        self.append((attn.layer_idx, q, k, v, scaling, window))
        return q * 0.5


def _agrees(model: torch.nn.Module, lean: LeanForward) -> bool:
    from transformers import AttentionInterface

    stock_records, lean_records = _Records(), _Records()
    prober, own = threading.get_ident(), own_attention(model.config)

    def probe(module, query, key, value, attention_mask, *, scaling=None, sliding_window=None, **kwargs):
        if threading.get_ident() != prober:  # another thread's plain forward meanwhile: its own attention
            stock = AttentionInterface().get_interface(own, sys.modules[type(module).__module__].eager_attention_forward)
            return stock(module, query, key, value, attention_mask, scaling=scaling, sliding_window=sliding_window,
                         **kwargs)
        lean_layout = (t[0].transpose(0, 1) for t in (query, key, value))  # [1, heads, T, dim] -> [T, heads, dim]
        return stock_records.attend(module, *lean_layout, scaling, sliding_window).unsqueeze(0), None

    AttentionInterface.register(_PROBE, probe)
    device = model.lm_head.weight.device
    vocab = model.config.vocab_size
    same = True
    # a prefill-shaped probe and a decode-shaped one (matmuls of one row may take other kernels)
    # (two kept rows of five: the pruned path pads them to four; four of nine: pruned as they are)
    for ids, positions, keep in (([1, 7, 3, 11, 5], [0, 1, 2, 9, 40], [1, 4]), ([9], [17], [0]),
                                 ([4, 2, 8, 6, 1, 3, 5, 7, 9], [0, 1, 2, 3, 4, 5, 6, 7, 8], [8, 0, 5, 3])):
        ids = torch.tensor([ids], device=device) % vocab
        positions, keep = torch.tensor([positions], device=device), torch.tensor(keep, device=device)
        try:
            with torch.inference_mode(), use_attention(attention_configs(model), _PROBE):
                stock = model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=keep).logits
                ours = lean(ids, positions, keep, lean_records.attend)
        except Exception:  # noqa: BLE001 - any failure of the probe means: keep the stock forward
            return False
        same = same and torch.equal(stock[0], ours)
    return same and len(stock_records) == len(lean_records) > 0 and all(
        a[0] == b[0] and a[4] == b[4] and a[5] == b[5] and all(torch.equal(x, y) for x, y in zip(a[1:4], b[1:4]))
        for a, b in zip(stock_records, lean_records)
    )
