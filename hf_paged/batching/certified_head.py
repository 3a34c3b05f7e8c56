"""`CertifiedArgmax`: each row's greedy token from a bf16 lm_head product, proven equal to the argmax of the exact
fp32 product; the exact values are computed only for the few columns of the few rows the proof leaves open.

Greedy decoding reads one number per row of the head's product, its argmax. On a CPU with native bf16 dot products
(AVX512-BF16, AMX) the bf16 product of a [32, 512] x [512, 50257] head takes about half the fp32 one's time (13.5
against 28 ms sliced, one thread), and a bound on its error leaves only a handful of columns that could be the
exact argmax; exact fp64 dot products over those columns settle almost every row.

The proof, for one row x (fp32, width D) and vocabulary rows w_j (fp32); s_j is the exact head's fp32 entry (MKL's
summation, in whatever order), t_j = x . w_j the real dot product, A_j the bf16 product's entry:

    |A_j - t_j| <= E = |x~| max|w~_j - w_j| + |x~ - x| max|w_j| + g(D) |x~| max|w~_j| + 2^-7 max|A| / (1 - 2^-7)
    |s_j - t_j| <= G_j = g(D + 1) sum_i |x_i w_ij| + D * 2^-126   <=   G = g(D + 1) |x| max|w_j| + D * 2^-126

(x~, w~: the bf16 roundings; the input roundings by Cauchy-Schwarz; the fp32 accumulation of D exact bf16 products in
any order, g(n) = n u / (1 - n u) with u = 2^-24; the product's own rounding to bf16, by nearest or toward zero;
denormals flushed.) A column j
with A_j < max A - 2E - 2G has s_j < s_m for the column m of the largest A, so the argmax is among the candidates
(A_j at or above that threshold). Among them the row is certified when the largest t beats every other candidate's
by more than the two G_j (t in fp64 with its own error bound added): that column's s is the strict maximum of the row,
so it is what `argmax` of the exact product returns (its first index on ties: there are none).

A row left open gets its candidates' exact fp32 entries from the very products the exact head runs (`_head`'s
vocabulary slices containing them) on that row beside other rows up to this CPU's `min_rows` (MKL gives a row the
same bits in any product of that many rows or more, on one thread: what the lean forward's pruning rests on;
`row_kernels.py` measures it), and takes
their argmax, lowest column on ties. Where the exact head does not slice or runs on several threads, the open rows'
step computes the whole exact head instead. The result is the exact head's argmax in every case; only its cost
depends on the proof.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.batching.lean_forward import _HEAD_CHUNK, _head
from hf_paged.batching.row_kernels import independent_rows
from hf_paged.batching.weights import tensor_stamp

_U32 = 2.0**-24  # fp32 unit roundoff
_U_BF16 = 2.0**-8  # bf16 unit roundoff (8 significant bits)
_U64 = 2.0**-53
_FLUSH = 2.0**-126  # a flushed denormal's absolute error, per operation
_BLOCK = 1024  # columns per block maximum while looking for candidates
MAX_CANDIDATES = 64  # a row with more candidate columns is settled by the exact head (its gather would cost more)
MIN_HEAD_WIDTH = 128  # narrower rows: the fp32 product is cheap, the bound's passes cost more than they save
# (32,768 x 64: 0.45x at 1 row, 0.90x at 32; 32,000 x 128: 1.04x / 2.2x; 50,257 x 256: 1.9x / 2.4x, one thread)
MIN_HEAD_ELEMENTS = 2**21  # smaller heads (8 MiB of fp32 and below) stay in cache: the bf16 product gains little


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def bf16_products_native() -> bool:
    """This CPU multiplies bf16 in hardware (AVX512-BF16 or AMX): the bf16 product is faster than the fp32 one."""
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                or getattr(cpu, "_is_amx_tile_supported", lambda: False)())


@dataclass(slots=True)
class HeadStats:
    rows: int = 0  # rows whose token this head picked
    open_rows: int = 0  # rows the proof left open (their candidates computed exactly)
    whole_heads: int = 0  # steps that computed the whole exact head (open rows where slices cannot be used)
    candidates: int = 0  # candidate columns over all rows
    exact_steps: int = 0  # steps left to the exact head while the copy was being made (or could not be)


@dataclass(slots=True, frozen=True)
class HeadCopy:
    key: tuple  # the weight's storage, version counter and shape when copied
    bf16: torch.Tensor  # [vocab, width], plain; or oneDNN's packed layout of it (`packed`)
    packed: bool
    w_max: float  # upper bounds of max_j |w_j|, max_j |w~_j - w_j|, max_j |w~_j|
    dw_max: float
    wb_max: float

    def product(self, xb: torch.Tensor) -> torch.Tensor:
        """`xb @ bf16.T`, [rows, vocab] bf16: oneDNN's linear over the packed weight (1 row 2.5 against 5.4 ms, 32
        rows 9.2 against 12.6 on GPT-2's head, the same values) where it was made, else `torch.mm`."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(xb, self.bf16, None, "none", [], "")
        return torch.mm(xb, self.bf16.t())


def _packed(bf16: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed layout of a bf16 weight, where this torch has it and its products equal `torch.mm`'s on a
    probe (the bound assumes fp32 accumulation, as `mm`'s); else None."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(bf16, None)
        probe = torch.linspace(-2, 2, 3 * bf16.shape[1]).reshape(3, -1).to(torch.bfloat16)
        same = torch.equal(torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], ""),
                           torch.mm(probe, bf16.t()))
    except (AttributeError, RuntimeError, NotImplementedError):  # a build without oneDNN, or a layout it refuses
        return None
    return packed if same else None


# id(weight) -> (a weak reference to it, its HeadCopy): engines over one model share the copy; it goes with the weight
_COPIES: dict[int, tuple[weakref.ref, HeadCopy]] = {}
_COPY_ROWS = 1024  # vocabulary rows per pass while copying: the passes over a slice stay in cache
_BUILD_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_BUILD_LOCK")  # a forked child gets a free lock (after_fork.py)


def current_copy(weight: torch.Tensor) -> HeadCopy | None:
    """The shared copy of `weight` as it is now (`tensor_stamp`: storage, version counter, shape, optimizer steps,
    sampled values), or None."""
    ref, copy = _COPIES.get(id(weight), (None, None))
    if ref is None or ref() is not weight or copy.key != tensor_stamp(weight):
        return None
    return copy


def head_copy(weight: torch.Tensor) -> HeadCopy:
    """The bf16 copy of an fp32 head and bounds of its row norms, shared by every engine over the same weight and
    made again when the weight changed in place (its version counter) or was replaced. In passes of `_COPY_ROWS` rows,
    fp32 norms raised by their own rounding's bound (no fp64 copy of the head: ~0.55 s for a [151936, 896] head, its
    oneDNN packing included). One build at a time: engines over one weight wait for the same copy."""
    with _BUILD_LOCK:
        copy = current_copy(weight)
        return copy if copy is not None else _build(weight)


def _build(weight: torch.Tensor) -> HeadCopy:
    key = tensor_stamp(weight)
    vocab, width = weight.shape
    bf16 = torch.empty(vocab, width, dtype=torch.bfloat16)
    w_max = dw_max = wb_max = 0.0
    with torch.no_grad():
        for start in range(0, vocab, _COPY_ROWS):
            rows = weight.detach()[start : start + _COPY_ROWS]
            rounded = bf16[start : start + _COPY_ROWS]
            rounded.copy_(rows)
            wide = rounded.float()  # exact
            w_max = max(w_max, float(torch.linalg.vector_norm(rows, dim=1).max()))
            dw_max = max(dw_max, float(torch.linalg.vector_norm(rows - wide, dim=1).max()))  # the difference is exact
            wb_max = max(wb_max, float(torch.linalg.vector_norm(wide, dim=1).max()))
    margin = 1 + 2 * _gamma(width + 4, _U32)  # an fp32 norm's relative error, twice over
    packed = _packed(bf16) if bf16_products_native() else None
    copy = HeadCopy(key, bf16 if packed is None else packed, packed is not None, w_max * margin, dw_max * margin,
                    wb_max * margin)
    number = id(weight)
    _COPIES[number] = (weakref.ref(weight, lambda _: _COPIES.pop(number, None)), copy)
    return copy


def _candidates(approx: torch.Tensor, lowered: torch.Tensor) -> list[list[int]]:
    """Each row's columns at or above its threshold (`lowered`, NaN: none), found through the maxima of 1,024-column
    blocks (one pass over the product, where a boolean mask, its count and its nonzero take three); a row with more
    than `MAX_CANDIDATES` (a zero or repeated head: many near-equal columns) gets none, and is settled exactly."""
    rows, vocab = approx.shape
    blocks = vocab // _BLOCK
    main = approx[:, : blocks * _BLOCK].view(rows, blocks, _BLOCK)
    maxima = main.amax(2)
    if vocab > blocks * _BLOCK:
        maxima = torch.cat((maxima, approx[:, blocks * _BLOCK :].amax(1, keepdim=True)), 1)
    hit = maxima >= lowered.unsqueeze(1)
    hit[hit.sum(1) > MAX_CANDIDATES] = False  # more blocks than candidates allowed: crowded
    pairs = hit.nonzero().tolist()
    found: list[list[int]] = [[] for _ in range(rows)]
    inner = [(r, b) for r, b in pairs if b < blocks]
    if inner:
        at_rows = torch.tensor([r for r, _ in inner])
        segments = main[at_rows, torch.tensor([b for _, b in inner])] >= lowered[at_rows].unsqueeze(1)
        for p, c in segments.nonzero().tolist():  # at most MAX_CANDIDATES x 1,024 entries a row
            r, b = inner[p]
            found[r].append(b * _BLOCK + c)
    for r, b in pairs:
        if b == blocks:  # the remainder past the last whole block
            tail = approx[r, blocks * _BLOCK :] >= lowered[r]
            found[r].extend(blocks * _BLOCK + c for c in tail.nonzero()[:, 0].tolist())
    return [columns if len(columns) <= MAX_CANDIDATES else [] for columns in found]


class CertifiedArgmax:
    """`tokens(x)` for the lm_head module `head` (fp32, CPU, no bias): the exact head's argmax of each row of x."""

    def __init__(self, head: torch.nn.Module, rows_independent: bool = True, background: bool = False) -> None:
        self.head = head
        self.rows_independent = rows_independent  # the lean forward's pruning check held (module docstring)
        self.stats = HeadStats()
        # background: the copy is made by a thread that the first call starts, and `tokens` answers None until it is
        # there (the caller takes the exact head meanwhile): no step waits for it, and an engine whose requests all
        # sample never makes it
        self.background = background
        self._builder: threading.Thread | None = None
        self._failed: Exception | None = None  # a background build that raised: the exact head from then on

    def _start(self) -> None:
        if self._failed is None and (self._builder is None or not self._builder.is_alive()):
            if current_copy(self.head.weight) is not None:
                return
            self._builder = threading.Thread(target=self._build, name="hf_paged-head-copy", daemon=True)
            self._builder.start()

    def _build(self) -> None:
        try:
            head_copy(self.head.weight)
        except Exception as exc:  # noqa: BLE001 -- out of memory, say: the exact head goes on serving
            self._failed = exc

    def ready(self, timeout: float | None = None) -> bool:
        """Whether the copy of the weight as it is now exists, after waiting up to `timeout` s for a background
        build, started here if none runs (None: until it ends)."""
        if current_copy(self.head.weight) is None:
            self._start()
            if self._builder is not None:
                self._builder.join(timeout)
        return current_copy(self.head.weight) is not None

    @staticmethod
    def applies(head: torch.nn.Module, forced: bool = False) -> bool:
        """A plain fp32 CPU head; unless `forced`, also a large one on a CPU with native bf16 products."""
        weight = getattr(head, "weight", None)
        if (not isinstance(weight, torch.Tensor) or getattr(head, "bias", None) is not None
                or weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2):
            return False
        return forced or (weight.numel() >= MIN_HEAD_ELEMENTS and weight.shape[1] >= MIN_HEAD_WIDTH
                          and bf16_products_native())

    def tokens(self, x: torch.Tensor) -> list[int] | None:
        """Each row's token; None where the copy of the weight as it is now is still being made in the background
        (or could not be made): the caller computes the exact head."""
        copy = current_copy(self.head.weight)
        if copy is None:
            if self.background or self._failed is not None:
                self._start()
                self.stats.exact_steps += 1
                return None
            copy = head_copy(self.head.weight)
        w_max, dw_max, wb_max = copy.w_max, copy.dw_max, copy.wb_max
        rows, width = x.shape
        self.stats.rows += rows
        xb = x.to(torch.bfloat16)
        # [rows, vocab], accumulated in fp32, rounded to bf16; read as fp32 (bf16 reductions take the slow path)
        approx = copy.product(xb).float()
        low, high = approx.amin(1), approx.amax(1)
        big = torch.maximum(low.double().abs(), high.double().abs())
        x64 = x.double()
        x_norm, xb_norm = x64.norm(dim=1), xb.double().norm(dim=1)
        dx_norm = (x64 - xb.double()).norm(dim=1)
        err_a = (xb_norm * dw_max + dx_norm * w_max + _gamma(width, _U32) * xb_norm * wb_max
                 + big * (2 * _U_BF16 / (1 - 2 * _U_BF16))  # (2u: truncation covered too)
                 + width * _FLUSH * (1 + xb_norm + wb_max))  # denormal inputs or sums flushed to zero
        err_s = _gamma(width + 1, _U32) * x_norm * w_max + width * _FLUSH
        threshold = high.double() - 2 * err_a - 2 * err_s
        # rows the proof takes: finite, and far from fp32's overflow (|x.w_j| <= |x| |w_j|, partial sums too)
        finite = torch.isfinite(threshold) & (x_norm * w_max < 2.0**100)
        # an fp32 threshold at or below the fp64 one (rounding to fp32 moves a value by at most 2^-24 of it); NaN
        # for the other rows (no candidate: they are settled exactly)
        lowered = (threshold - threshold.abs() * 2.0**-22 - 1e-30).where(finite, torch.full_like(threshold, torch.nan))
        by_row = _candidates(approx, lowered.float())
        pairs = [(r, j) for r, columns in enumerate(by_row) for j in columns]
        finite_rows = [f and bool(c) for f, c in zip(finite.tolist(), by_row)]  # crowded rows have none: exact
        cols = [j for r, j in pairs]
        wide = self.head.weight.detach()[cols].double() if cols else None
        take = torch.tensor([r for r, j in pairs], dtype=torch.long)
        products = x64.index_select(0, take) * wide if cols else None
        dots = products.sum(1).tolist() if cols else []
        sums = products.abs().sum(1).tolist() if cols else []
        g_s, g_t = _gamma(width + 1, _U32), _gamma(width + 1, _U64)
        tokens: list[int | None] = [None] * rows
        open_rows: dict[int, list[int]] = {}
        k = 0
        for r in range(rows):
            candidates = by_row[r]
            n = len(candidates)
            self.stats.candidates += n
            if not finite_rows[r] or n == 0:
                open_rows[r] = []
                k += n
                continue
            # each candidate's interval for its exact fp32 entry s_j: t_j (fp64) +- (G_j + the fp64 sum's error)
            lows, highs = [], []
            for i in range(k, k + n):
                slack = g_s * sums[i] + g_t * sums[i] + width * _FLUSH
                lows.append(dots[i] - slack)
                highs.append(dots[i] + slack)
            k += n
            best = max(range(n), key=lows.__getitem__)
            if all(i == best or highs[i] < lows[best] for i in range(n)):
                tokens[r] = candidates[best]
            else:
                open_rows[r] = candidates
        if open_rows:
            self._settle(x, open_rows, tokens)
        return tokens  # type: ignore[return-value]

    def _settle(self, x: torch.Tensor, open_rows: dict[int, list[int]], tokens: list[int | None]) -> None:
        """The open rows' tokens from the exact head's own products (module docstring)."""
        self.stats.open_rows += len(open_rows)
        rows = x.shape[0]
        weight = self.head.weight.detach()
        vocab = weight.shape[0]
        sliced = (self.rows_independent and torch.get_num_threads() == 1 and vocab >= 4 * _HEAD_CHUNK
                  and all(open_rows.values()))
        min_rows = independent_rows({(weight.shape[1], _HEAD_CHUNK)}) if sliced else None  # this CPU's (memoised)
        if min_rows is None or rows < min_rows:
            self.stats.whole_heads += 1
            exact = _head(self.head, x)
            for r in open_rows:
                tokens[r] = int(exact[r].argmax())
            return
        last_start = (vocab // _HEAD_CHUNK - 1) * _HEAD_CHUNK  # `_head`'s last slice takes the remainder
        for r, candidates in open_rows.items():
            others = [i for i in range(rows) if i != r][: min_rows - 1]
            block = x[[r, *others]]
            values: dict[int, float] = {}
            for start in sorted({min(j // _HEAD_CHUNK * _HEAD_CHUNK, last_start) for j in candidates}):
                end = vocab if start == last_start else start + _HEAD_CHUNK
                out = torch.mm(block, weight[start:end].t())[0]
                for j in candidates:
                    if start <= j < end:
                        values[j] = float(out[j - start])
            tokens[r] = max(sorted(values), key=values.__getitem__)  # the lowest column among equal maxima
