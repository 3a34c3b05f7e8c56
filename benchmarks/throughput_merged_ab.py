"""q/k/v as one matmul, RoPE once over q|k, and gate/up as one matmul, in the engine's lean forward, against the
lean forward as it is, interleaved in one process (issue 36 point 5, the brief's lever 2): CPU time of hf_paged's
timed `generate_batch` on `benchmarks/throughput.py`'s workloads and whether the tokens are the same. The merged
weights are copies made at the first call (enough to measure; the kept design would re-point the modules'
parameters as views of one merged tensor). Not kept: see `throughput_profile.md`.

    OMP_NUM_THREADS=1 HF_PAGED_JIT=now python benchmarks/throughput_merged_ab.py gqa6 [repeats]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import hf_paged
from benchmarks.common import machine
from benchmarks.throughput import timed_generate_batch, workload_and_model
from hf_paged.batching import lean_forward as lf
from hf_paged.batching.lean_forward import _head, _linear, _pruned_rows, _rms_norm, _rope

SPLIT = lf.LeanForward.__call__
_MERGED: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(q_proj) -> (q|k|v weight, gate|up weight)


def merged_call(self, input_ids, position_ids, keep, attend):
    """`LeanForward.__call__` with one q|k|v matmul (RoPE once over its q|k heads; v a view) and one gate|up
    matmul (SiLU and `* up` on column views): every element the same op on the same values."""
    hidden = self.embed(input_ids[0])
    cos, sin = self.rotary(hidden, position_ids)
    cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    tokens = hidden.shape[0]
    rows = _pruned_rows(keep, tokens, self.min_rows) if self.prune and torch.get_num_threads() == 1 else None
    last = self.layers[-1].attn
    for in_norm, attn, q_proj, k_proj, v_proj, o_proj, window, post_norm, gate, up, down, act in self.layers:
        weights = _MERGED.get(id(q_proj))
        if weights is None:
            weights = _MERGED[id(q_proj)] = (torch.cat([q_proj.weight, k_proj.weight, v_proj.weight]),
                                             torch.cat([gate.weight, up.weight]))
        heads, kv = q_proj.weight.shape[0] // attn.head_dim, k_proj.weight.shape[0] // attn.head_dim
        x = _rms_norm(in_norm, hidden)
        qkv = torch.mm(x, weights[0].t()).view(tokens, -1, attn.head_dim)
        qk = _rope(qkv[:, :heads + kv], cos, sin)
        out = attend(attn, qk[:, :heads], qk[:, heads:], qkv[:, heads + kv:], attn.scaling, window)
        out = out.reshape(tokens, -1)
        if rows is not None and attn is last:
            out, hidden = out[rows], hidden[rows]
        hidden = _linear(o_proj, out.contiguous()).add_(hidden)
        x = _rms_norm(post_norm, hidden)
        inter = gate.weight.shape[0]
        gate_up = torch.mm(x, weights[1].t())
        hidden = _linear(down, act(gate_up[:, :inter]).mul_(gate_up[:, inter:])).add_(hidden)
    hidden = _rms_norm(self.norm, hidden)
    return _head(self.head, hidden[keep] if rows is None else hidden[: keep.numel()])


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "gqa6"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    work, model = workload_and_model(name)
    params = [hf_paged.SamplingParams(max_new_tokens=w) for w in work.max_new_tokens]
    calls = {"split": SPLIT, "merged": merged_call}
    times: dict[str, list[float]] = {side: [] for side in calls}
    tokens: dict[str, list] = {}

    def setup(engine) -> None:
        assert engine.runner.lean is not None, "no lean forward here"

    for r in range(repeats):
        for side in ("split", "merged") if r % 2 == 0 else ("merged", "split"):
            lf.LeanForward.__call__ = calls[side]
            try:
                cpu, _, tokens[side] = timed_generate_batch(model, work, params, setup)
            finally:
                lf.LeanForward.__call__ = SPLIT
            times[side].append(cpu)
    split, merged = times["split"], times["merged"]
    print(f"{name}: split {', '.join(f'{t:.2f}' for t in split)} s; merged {', '.join(f'{t:.2f}' for t in merged)} s; "
          f"best split / best merged {min(split) / min(merged):.3f}; paired "
          f"{', '.join(f'{a / b:.3f}' for a, b in zip(split, merged))}; same tokens: {tokens['split'] == tokens['merged']}")


if __name__ == "__main__":
    main()
