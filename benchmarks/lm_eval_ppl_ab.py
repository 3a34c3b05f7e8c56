"""Rolling perplexity, interleaved A/B: lm-eval's `hf` backend at batch 1 vs `hf-paged` (PagedLM), CPU time of
`loglikelihood_rolling` on the hf_paged_ppl documents, pair by pair in one process (issue 44).

Each pair builds a fresh PagedLM (untimed, as `benchmarks/lm_eval.py` builds one per side): a second call on the same
engine finds every later window's context in the prefix cache and computes only the scored rows (9,721 of the
47,983 tokens fewer on the embedded model), which is not what one evaluation does. The order inside a pair
alternates (hf first in even pairs); every document's log-likelihood is checked against hf (1e-6 relative).

    python benchmarks/lm_eval_ppl_ab.py --pairs 5 [--model llama50m]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != HERE]  # not ./lm_eval*
os.environ.setdefault("HF_PAGED_JIT", "now")

from lm_eval.models.huggingface import HFLM

import hf_paged
from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.integrations.lm_eval import PagedLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine


class _Request:
    def __init__(self, text: str) -> None:
        self.args = (text,)


def _documents() -> list[_Request]:
    sys.path.insert(0, str(DEFAULT_MODEL_PATH.parent / "lm_eval_tasks"))
    from paged_tasks import load_ppl

    return [_Request(doc["text"]) for doc in load_ppl()["test"]]


def _timed(lm, requests) -> tuple[float, list[float]]:
    start = time.process_time()
    out = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    return time.process_time() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--model", default="tiny", choices=("tiny", "llama50m"), help="as benchmarks/lm_eval.py's")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}", flush=True)
    tmp = tempfile.TemporaryDirectory()
    if args.model == "tiny":
        path = str(DEFAULT_MODEL_PATH)
    else:
        from benchmarks.lm_eval import _llama50m  # the same random 51M Llama, saved the same way

        path = _llama50m(tmp.name)
    requests = _documents()
    hf = HFLM(pretrained=path, dtype="float32", device="cpu", batch_size=1)
    hf.loglikelihood_rolling(requests[:1], disable_tqdm=True)  # lm-eval's and torch's first-call costs, untimed
    hf_s, paged_s, ratios = [], [], []
    for i in range(args.pairs):
        paged = PagedLM(pretrained=path, dtype="float32", device="cpu")
        engine = hf_paged.engine_of(paged.model)
        if i % 2 == 0:
            (th, ours_hf), (tp, ours) = _timed(hf, requests), _timed(paged, requests)
        else:
            (tp, ours), (th, ours_hf) = _timed(paged, requests), _timed(hf, requests)
        error = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(ours, ours_hf, strict=True))
        assert error <= 1e-6, f"pair {i}: a document's log-likelihood differs from hf by {error:.2e} (relative)"
        hf_s.append(th)
        paged_s.append(tp)
        ratios.append(th / tp)
        print(f"pair {i}: hf b1 {th:.2f} s, hf-paged {tp:.2f} s ({engine.metrics.num_computed_tokens} tokens), "
              f"hf / hf-paged {th / tp:.3f}, max relative difference {error:.1e}, load {os.getloadavg()[0]:.1f}",
              flush=True)
    print(f"median: hf b1 {statistics.median(hf_s):.2f} s, hf-paged {statistics.median(paged_s):.2f} s; ratio per "
          f"pair median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
