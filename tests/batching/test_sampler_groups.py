"""Sampled rows drawn together (`Sampler._draw_together`): rows with no stock processor but row-only warpers and no
seed go through the chain as one tensor and one draw, with the same tokens, scores and failures as row by row."""

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from hf_paged import SamplingParams
from hf_paged.batching import sampler as sampler_module
from hf_paged.batching.request import Request
from hf_paged.batching.sampler import Sampler

VOCAB = 64
TOGETHER = sampler_module._drawn_together


def _requests(shared_warpers):
    """Six sampled rows in three groups (params / warper objects), one asking for scores, one greedy row."""
    top_k, top_p = TopKLogitsWarper(8), TopPLogitsWarper(0.9)
    specs = [{"temperature": 0.7, "top_p": 0.8}, {"temperature": 0.7, "top_p": 0.8, "output_scores": True},
             {"temperature": 1.3}, {}, {}, {"temperature": 1.3, "min_new_tokens": 3, "eos_token_id": [5, 6]}]
    requests = []
    for i, spec in enumerate(specs):
        procs = [top_k, top_p] if i >= 3 and shared_warpers else []
        requests.append(Request(f"r{i}", [1, 2, 3], SamplingParams(do_sample=True, max_new_tokens=8,
                                                                  logits_processors=procs, **spec)))
    requests.insert(2, Request("greedy", [1, 2], SamplingParams(max_new_tokens=8)))
    return requests


def _sample(requests, logits, together: bool, monkeypatch):
    if not together:  # every row through `_process_row` and `_pick`, one at a time
        monkeypatch.setattr(sampler_module, "_drawn_together", lambda request: False)
    torch.manual_seed(7)
    out = Sampler()(requests, logits.clone())
    monkeypatch.setattr(sampler_module, "_drawn_together", TOGETHER)
    return out


@pytest.mark.parametrize("run_rows", [4096, 2])  # runs of one same-warper stretch, or cut every 2 rows
def test_rows_drawn_together_equal_rows_drawn_one_by_one(monkeypatch, run_rows):
    monkeypatch.setattr(sampler_module, "_RUN_BYTES", run_rows * VOCAB * 4)
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(0))
    for shared in (True, False):
        for _ in range(3):
            grouped_requests, single_requests = _requests(shared), _requests(shared)
            grouped = _sample(grouped_requests, logits, True, monkeypatch)
            single = _sample(single_requests, logits, False, monkeypatch)
            assert grouped.token_ids == single.token_ids and grouped.errors == single.errors == [None] * 7
            assert torch.equal(grouped_requests[1].scores[0], single_requests[1].scores[0])
            assert grouped.token_ids[-1] not in (5, 6)  # min_new_tokens kept EOS out
            logits = logits.roll(1, dims=1)


def test_a_row_that_overflows_fails_alone_in_its_group():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    logits[1] = float("nan")
    requests = [Request(f"r{i}", [1], SamplingParams(do_sample=True, temperature=0.5)) for i in range(3)]
    out = Sampler()(requests, logits)
    assert out.token_ids[0] is not None and out.token_ids[2] is not None and out.token_ids[1] is None
    assert "not finite" in out.errors[1].message and out.errors[0] is None and out.errors[2] is None


def test_seeded_rows_and_other_processors_keep_their_own_path(monkeypatch):
    """A seed draws from the request's own generator (its stream must not depend on the step's other rows); a
    processor that reads the history is called per row."""
    class ReadsHistory:
        def __call__(self, input_ids, scores):
            return scores

    seeded = Request("s", [1], SamplingParams(do_sample=True, seed=3))
    history = Request("h", [1], SamplingParams(do_sample=True, logits_processors=[ReadsHistory()]))
    warped = Request("w", [1], SamplingParams(do_sample=True, logits_processors=[TopKLogitsWarper(4)]))
    assert [sampler_module._drawn_together(r) for r in (seeded, history, warped)] == [False, False, True]
    calls = []
    real = Sampler._pick
    monkeypatch.setattr(Sampler, "_pick", lambda self, request, row: calls.append(request.request_id) or
                        real(self, request, row))
    Sampler()([seeded, history, warped], torch.randn(3, VOCAB))
    assert calls == ["s", "h"]


def test_a_run_whose_warper_raises_goes_row_by_row(monkeypatch):
    """No token and nothing recorded for the run: its rows take the row-by-row path, where a failure is only its
    own request's (here none fails: the warper refuses batches only)."""
    real = sampler_module.TopKLogitsWarper

    class NoBatches(real):
        def __call__(self, input_ids, scores):
            if scores.shape[0] > 1:
                raise RuntimeError("one row at a time")
            return super().__call__(input_ids, scores)

    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3))
    requests = [Request(f"r{i}", [1], SamplingParams(do_sample=True, top_k=5, output_scores=True)) for i in range(3)]
    monkeypatch.setattr(sampler_module, "TopKLogitsWarper", NoBatches)
    out = Sampler()(requests, logits.clone())
    assert out.errors == [None] * 3 and all(t is not None for t in out.token_ids)
    assert [len(r.scores) for r in requests] == [1, 1, 1]


@pytest.mark.parametrize("warpers", [{}, {"top_k": 10}, {"temperature": 0.6, "top_p": 0.9}])
def test_num_return_sequences_draws_in_stocks_row_order(warpers):
    """`generate(do_sample=True, num_return_sequences=n)` under `torch.manual_seed`: stock draws from rows
    [p0 x n, p1 x n, ...]; the engine drew parents first and forks after them ([p0, p1, p0', p1']), other tokens
    from the same seed. Forks now run right after their parent (`Scheduler.run_fork`, the first step's samplers)."""
    import hf_paged
    from tests.tiny_models import tiny_model

    model = tiny_model("llama")
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 18], [0, 21, 22, 23, 24, 25, 26, 27]])
    kwargs = {"attention_mask": (ids != 0).long(), "max_new_tokens": 10, "do_sample": True, "pad_token_id": 0,
              "eos_token_id": None, "num_return_sequences": 3, **warpers}  # no row ends early: one stream
    torch.manual_seed(11)
    stock = model.generate(ids, **kwargs)
    hf_paged.wrap(model)
    try:
        torch.manual_seed(11)
        assert torch.equal(model.generate(ids, **kwargs), stock)
    finally:
        hf_paged.unwrap(model)
