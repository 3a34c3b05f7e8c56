"""Log-probabilities with the model on a CUDA device (run with `-m gpu`; `scripts/gpu_check.sh` style): the paths a
CPU run cannot prove, where a CPU index tensor against CUDA logits raises. Greedy, seeded sampling with forks,
speculation (verification rows) and scoring with alternatives, each against a stock forward on the device.
HF_PAGED_TEST_DEVICE=cpu runs them on the CPU (to check the tests themselves without a GPU)."""

from __future__ import annotations

import os

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

DEVICE = torch.device(os.environ.get("HF_PAGED_TEST_DEVICE", "cuda"))
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(),
                                                  reason="needs a CUDA device")]
ATOL = 1e-4  # fp32 on the GPU: other kernels than the stock forward's reference run


def reference(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated], device=DEVICE)).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : len(prompt) - 1 + len(generated)].cpu()


def check(model, out, k: int) -> None:
    assert out.error is None, out.error
    tokens = out.generated_tokens
    assert [e.token_id for e in out.logprobs] == tokens
    ref = reference(model, out.prompt_ids, tokens)
    for j, entry in enumerate(out.logprobs):
        assert abs(entry.logprob - float(ref[j, tokens[j]])) < ATOL
        assert [t.token_id for t in entry.top] == torch.topk(ref[j], k).indices.tolist()


def test_logprobs_on_the_device():
    model = tiny_model("llama").to(DEVICE)
    prompts = ragged_prompts([5, 17, 30], seed=2)
    engine = Engine(model, PagedConfig(block_size=8, max_num_batched_tokens=32))
    params = [SamplingParams(max_new_tokens=10, logprobs=3),
              SamplingParams(max_new_tokens=10, do_sample=True, seed=4, num_return_sequences=2, logprobs=2),
              SamplingParams(max_new_tokens=10)]
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    outs = engine.run()
    assert outs[ids[0]].generated_tokens == stock_greedy(model, prompts[:1], 10)[0]
    check(model, outs[ids[0]], 3)
    for rid, out in outs.items():
        if rid.startswith(ids[1]):
            check(model, out, 2)
    assert outs[ids[2]].logprobs is None

    repetitive = prompts[0] * 6  # prompt lookup drafts; greedy keeps some
    (rid,) = [engine.add_request(repetitive, SamplingParams(max_new_tokens=16, num_speculative_tokens=4,
                                                             logprobs=2))]
    out = engine.run([rid])[rid]
    assert out.num_accepted_tokens > 0
    check(model, out, 2)

    scored = prompts[1]
    rid = engine.add_request(scored[:-1], SamplingParams(score_targets=scored[10:], logprobs=2))
    out = engine.run([rid])[rid]
    ref = reference(model, scored[:10], scored[10:])
    for j, top in enumerate(out.score_top_logprobs):
        assert [t.token_id for t in top] == torch.topk(ref[j], 2).indices.tolist()
