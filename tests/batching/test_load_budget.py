"""A waiting request whose disk-tier load ends in a step that spends the step's whole prompt budget on block writes
is not admitted in that step: nothing runs and nothing is left loading, yet work was done. The engine took such a
step for one where the request can never fit and failed it ("needs more blocks than the pool can ever free")."""

from __future__ import annotations

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer.cost_model import TransferCostModel
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


def _run(engine, prompts):
    outputs = []
    for prompt in prompts:  # one at a time: the first fills the disk tier, the later ones load from it
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=4))
        while engine.has_unfinished:
            engine.step()
            engine.check_integrity()
        outputs.append(engine.pop_output(rid))
    return outputs


def test_a_load_that_takes_the_whole_step_budget_does_not_fail_its_request(tmp_path, monkeypatch):
    model = tiny_model("llama")
    system = ragged_prompts([40], seed=1)[0]
    prompts = [system + tail for tail in ragged_prompts([5, 9, 7], seed=2)]
    config = PagedConfig(block_size=4, num_blocks=24, kv_offload_dir=str(tmp_path), max_num_batched_tokens=64)
    first = Engine(model, config)
    _run(first, prompts)
    with first.lock:
        first.scheduler.kv_transfer.save_cached()
    first.scheduler.kv_transfer.close()
    # a slow disk: each block write is priced past the step's budget, so a load's every chunk takes a whole step
    monkeypatch.setattr(TransferCostModel, "block_tokens", lambda self, nbytes: 1e6)
    second = Engine(model, config)
    outputs = _run(second, prompts)
    assert [o.error for o in outputs] == [None] * len(prompts)
    assert second.stats()["kv_transfer_loaded_blocks"] > 0  # (the loads ran)
    assert [o.generated_tokens for o in outputs] == stock_greedy(model, prompts, 4)
