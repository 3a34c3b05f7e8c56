"""Bitmask application: torch reference == numpy fast path == Triton kernel (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from hf_paged.processors.index.bitmask import allocate_token_bitmask, apply_token_bitmask_, num_bitmask_words

BACKENDS = ["torch", "numpy", "triton"]


def apply_on(backend: str, logits: torch.Tensor, bitmask: torch.Tensor, rows=None) -> torch.Tensor:
    """`apply_token_bitmask_` where the backend runs: compiled Triton (a CUDA machine) takes CUDA tensors, the
    interpreter and the other backends CPU ones; the result comes back on the CPU."""
    if backend != "triton" or not torch.cuda.is_available():
        return apply_token_bitmask_(logits, bitmask, rows=rows, backend=backend)
    return apply_token_bitmask_(logits.cuda(), bitmask.cuda(), rows=rows, backend=backend).cpu()


def _case(num_rows: int, width: int, words: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, width, generator=gen).to(dtype)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (num_rows, words), generator=gen, dtype=torch.int32)
    return logits, bitmask


def _expected(logits: torch.Tensor, bitmask: torch.Tensor, rows=None) -> torch.Tensor:
    out = logits.clone()
    for r in range(logits.shape[0]) if rows is None else rows:
        for col in range(logits.shape[1]):
            word = col // 32
            allowed = word < bitmask.shape[1] and (int(bitmask[r, word]) >> (col % 32)) & 1
            if not allowed:
                out[r, col] = float("-inf")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_example_bits(backend):
    logits = torch.zeros(1, 70)
    mask = torch.tensor([[0b101, -(2**31)]], dtype=torch.int32)  # bits 0 and 2; bit 31 of word 1 = column 63
    logits = apply_on(backend, logits, mask)
    assert (logits[0] == 0).nonzero().flatten().tolist() == [0, 2, 63]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backends_match_the_definition(backend, dtype):
    # 70 columns, 2 words: columns 64..69 are padded embedding rows with no bits -> always masked
    logits, bitmask = _case(3, 70, 2, dtype)
    want = _expected(logits, bitmask)
    got = apply_on(backend, logits.clone(), bitmask)
    assert torch.equal(got, want)
    assert torch.isinf(got[:, 64:]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [200 * 32 + 5, 200 * 32 - 7])
def test_sparse_and_nearly_full_masks(backend, width):
    # 200 words: a few allowed tokens (row 0), all but a few (row 1), all (row 2), none (row 3)
    bitmask = torch.zeros(4, 200, dtype=torch.int32)
    bitmask[0, 3] = 0b1001
    bitmask[0, 199] = -(2**31)  # column 6399: past the width in the narrower case
    bitmask[1] = -1
    bitmask[1, 0] = ~0b110
    bitmask[1, 150] = 0
    bitmask[2] = -1
    logits = torch.randn(4, width, generator=torch.Generator().manual_seed(3))
    got = apply_on(backend, logits.clone(), bitmask)
    assert torch.equal(got, _expected(logits, bitmask))
    keep = (got[0] != float("-inf")).nonzero().flatten().tolist()
    assert keep == ([96, 99, 6399] if width > 6399 else [96, 99])
    banned = (got[1] == float("-inf")).nonzero().flatten().tolist()
    assert banned == [1, 2] + list(range(4800, 4832)) + list(range(6400, width))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_subset_leaves_other_rows_alone(backend):
    logits, bitmask = _case(4, 40, 2, torch.float32, seed=1)
    got = apply_on(backend, logits.clone(), bitmask, rows=[3, 1])
    assert torch.equal(got, _expected(logits, bitmask, rows=[3, 1]))
    assert torch.equal(got[0], logits[0]) and torch.equal(got[2], logits[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_narrower_than_the_bitmask(backend):
    logits, bitmask = _case(2, 33, 3, torch.float32, seed=2)
    assert torch.equal(apply_on(backend, logits.clone(), bitmask), _expected(logits, bitmask))


def test_allocate_and_checks():
    mask = allocate_token_bitmask(2, 65)
    assert mask.shape == (2, num_bitmask_words(65)) == (2, 3) and mask.dtype == torch.int32
    assert int(mask.abs().sum()) == 0
    with pytest.raises(TypeError, match="int32"):
        apply_token_bitmask_(torch.zeros(1, 8), torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="rows="):
        apply_token_bitmask_(torch.zeros(2, 8), torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="backend"):
        apply_token_bitmask_(torch.zeros(1, 8), torch.zeros(1, 1, dtype=torch.int32), backend="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_triton_on_cuda_matches_the_reference(dtype):
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 50_304, generator=gen).to(dtype)  # GPT-2's vocabulary padded to a multiple of 64
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, 1571), generator=gen, dtype=torch.int32)
    bitmask[1] = 0
    bitmask[1, 7] = 5
    want = apply_token_bitmask_(logits.clone(), bitmask, backend="torch")
    got = apply_token_bitmask_(logits.cuda(), bitmask.cuda(), backend="triton").cpu()
    assert torch.equal(got, want)
    rows = torch.tensor([4, 1], device="cuda")
    want = apply_token_bitmask_(logits.clone(), bitmask, rows=[4, 1], backend="torch")
    got = apply_token_bitmask_(logits.cuda(), bitmask.cuda(), rows=rows, backend="triton").cpu()
    assert torch.equal(got, want)


def test_compiled_row_loop_matches_its_twin_and_the_definition():
    import numpy as np

    from hf_paged.processors import jit
    from hf_paged.processors.index.mask_kernel import mask_row, mask_row_numpy

    if not jit.wait(1800):  # a cold numba cache on a loaded machine: the compile child runs at nice 10
        pytest.skip("numba's compiled kernels are unavailable here")
    gen = torch.Generator().manual_seed(5)
    for width, num_words in ((50_257, 1571), (50_304, 1571), (70, 2), (33, 3)):
        bitmask = torch.randint(-(2**31), 2**31 - 1, (6, num_words), generator=gen, dtype=torch.int32)
        bitmask[1] = 0  # none allowed
        bitmask[2] = -1  # all allowed (but the padded columns)
        bitmask[3] = 0
        bitmask[3, num_words // 2] = 0b1001  # a few allowed
        bitmask[4] = -1
        bitmask[4, 0] = ~0b110  # a few banned
        bitmask[5, ::3] = 0  # runs of empty words between mixed ones
        for dtype in (torch.float32, torch.float64):
            logits = torch.randn(6, width, generator=gen).to(dtype)
            want = _expected(logits, bitmask) if width < 100 else None
            for row in range(6):
                fast, twin = logits[row].clone().numpy(), logits[row].clone().numpy()
                mask_row.compiled(fast, bitmask[row].numpy())
                mask_row_numpy(twin, bitmask[row].numpy())
                assert np.array_equal(fast, twin), (width, row, dtype)
                if want is not None:
                    assert np.array_equal(fast, want[row].numpy()), (width, row, dtype)
