"""`store_kv` in Triton: scatter each new token's K/V rows into its cache slot.

Grid: (num_tokens,). Program t reads key[t] and value[t] ([num_kv_heads, head_dim] each) and writes them to
slot = slot_mapping[t] = block_id * block_size + offset; a negative slot means "skip" (padding, or a token whose
K/V is already cached). A quantizing variant will compute the block scale here, where the rows are in registers.
"""

from __future__ import annotations

import torch

from hf_paged.cache.kernels import launch, triton_common
from hf_paged.cache.kernels.launch import KernelLaunch, StoreLaunchConfig

__all__ = ["store_kv_triton", "store_launch"]

_DEFINED = False


def _define() -> None:
    """Define the kernel as a module global on first use (see triton_common for why globals)."""
    global _DEFINED, triton, tl, _store_kernel
    if _DEFINED:
        return
    tl = triton_common.jit_helpers()[0]
    triton = triton_common.import_triton()

    @triton.jit
    def _store_kernel(
        key_ptr,
        value_ptr,
        k_cache_ptr,
        v_cache_ptr,
        slot_mapping_ptr,
        stride_key_tok,
        stride_key_head,
        stride_value_tok,
        stride_value_head,
        stride_k_block,
        stride_k_slot,
        stride_k_head,
        stride_v_block,
        stride_v_slot,
        stride_v_head,
        NUM_KV_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        token = tl.program_id(0)
        slot = tl.load(slot_mapping_ptr + token)
        if slot < 0:
            return
        block_id = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        heads = tl.arange(0, BLOCK_H)
        dims = tl.arange(0, BLOCK_D)
        mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
        key = tl.load(key_ptr + token * stride_key_tok + heads[:, None] * stride_key_head + dims[None, :], mask=mask)
        value = tl.load(
            value_ptr + token * stride_value_tok + heads[:, None] * stride_value_head + dims[None, :], mask=mask
        )
        k_dst = k_cache_ptr + block_id * stride_k_block + offset * stride_k_slot
        v_dst = v_cache_ptr + block_id * stride_v_block + offset * stride_v_slot
        tl.store(k_dst + heads[:, None] * stride_k_head + dims[None, :], key, mask=mask)
        tl.store(v_dst + heads[:, None] * stride_v_head + dims[None, :], value, mask=mask)

    _DEFINED = True


def store_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    config: StoreLaunchConfig | None = None,
) -> None:
    """Run `store_kv`; arguments are checked by `hf_paged.cache.kernels.store_kv`."""
    if key.shape[0] > 0:
        store_launch(key, value, key_cache, value_cache, slot_mapping, config=config).run()


def store_launch(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    config: StoreLaunchConfig | None = None,
) -> KernelLaunch:
    """The launch of one `store_kv`, not yet run."""
    _define()
    num_tokens, num_kv_heads, head_dim = key.shape
    if config is None:
        config = launch.store_launch_config(num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=key.dtype)
    # fmt: off
    args = (
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
    )
    # fmt: on
    return KernelLaunch(
        kernel=_store_kernel,
        grid=(num_tokens,),
        args=args,
        constexprs={
            "NUM_KV_HEADS": num_kv_heads,
            "HEAD_DIM": head_dim,
            "BLOCK_SIZE": key_cache.shape[1],
            "BLOCK_H": config.block_h,
            "BLOCK_D": config.block_d,
        },
        num_warps=config.num_warps,
        num_stages=1,
    )
