"""Where the timed run of `benchmarks/throughput.py` spends its time: a py-spy profile folded into a table.

    py-spy record --native -r 200 -f raw -o prof.txt -- python benchmarks/throughput.py --only-ours [--workload gqa6]
    python benchmarks/throughput_profile.py prof.txt

Only the timed `generate_batch` call's steps count: the samples under the timed call in the calling thread, and the
engine loop thread's steps (whichever thread holds the loop's turn runs a step; the untimed warm-up runs before,
in the calling thread). Each sample goes to the innermost frame that names a category below (a matmul inside
`_linear` counts as `_linear`, the numba kernel's frames as the kernel launch that called it). py-spy samples wall
time: on a loaded machine the shares are those of the time the threads were running or runnable.
"""

from __future__ import annotations

import argparse
from collections import Counter

CATEGORIES = (  # (function name in the profile, what it is), innermost match wins
    ("CpuLaunch.run", "decode / short-chunk attention kernel (numba)"),
    ("run_attention_plan", "SDPA of long prefill chunks (torch)"),
    ("BlockLayer.update_packed", "storing the step's keys and values"),
    ("_linear", "projections, MLP and lm_head matmuls (`_linear`)"),
    ("_rms_norm", "RMSNorm"),
    ("_rope", "RoPE (rotary tables and rotation)"),
    ("dynamic_rope_update.<locals>.wrapper", "RoPE (rotary tables and rotation)"),
    ("SiLUActivation.forward", "SiLU"),
    ("Embedding.forward", "embedding"),
    ("attend_packed", "attention dispatch around the kernels (plans, launches, checks)"),
    ("LeanForward.__call__", "the rest of the forward (residual adds, gate*up, row picks)"),
    ("build_step_inputs", "step inputs"),
    ("Sampler.__call__", "sampling"),
    ("ModelRunner.forward", "the runner's input tensors"),
    ("Engine._run", "engine bookkeeping (scheduler, appending, prefix cache)"),
)


def fold(path: str) -> tuple[int, Counter]:
    names = dict(CATEGORIES)
    counts: Counter = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, n = line.rsplit(" ", 1)
            frames = [frame.split(" (")[0] for frame in stack.split(";")]
            if "timed" not in frames and not ("EngineLoop._run" in frames and "Engine._run" in frames):
                continue
            total += int(n)
            hit = next((names[name] for name in reversed(frames) if name in names), "other (engine loop, threads)")
            counts[hit] += int(n)
    return total, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", help="py-spy's raw (collapsed stacks) output")
    total, counts = fold(parser.parse_args().profile)
    print(f"{total} samples in the timed run\n\n| share | what |\n|---|---|")
    for what, n in counts.most_common():
        print(f"| {100 * n / total:.1f}% | {what} |")


if __name__ == "__main__":
    main()
