"""hf_paged over several processes: data-parallel generation and tensor-parallel models.

    # torchrun --nproc_per_node 2 eval.py   (or accelerate launch eval.py): every rank runs the same script
    model = hf_paged.wrap(AutoModelForCausalLM.from_pretrained(path))
    outputs = hf_paged.distributed.generate_batch(model, prompts, max_new_tokens=64)   # all outputs, every rank

    # tensor parallel (torchrun): the same wrap; every rank gets every output
    model = hf_paged.wrap(AutoModelForCausalLM.from_pretrained(path, tp_plan="auto"))

| module            | cares about                                  | in -> out                                       |
|-------------------|----------------------------------------------|-------------------------------------------------|
| `sharding`        | which rank runs which prompt (pure, no torch)| prompts, ranks -> `ShardPlan`                   |
| `agreement`       | ranks asked alike, or all raise the same     | each rank's call -> one verdict, every rank     |
| `data_parallel`   | shard, run each rank's engine, gather        | wrapped model, prompts -> outputs on every rank |
| `tensor_parallel` | a `tp_plan` model under the engine           | model, `PagedConfig` -> checks, agreed blocks   |
"""

from __future__ import annotations

from hf_paged.distributed.data_parallel import DistributedRun, generate_batch, run_sharded, world
from hf_paged.distributed.sharding import ShardPlan, plan_shards
from hf_paged.distributed.tensor_parallel import (
    check_tensor_parallel,
    engine_config,
    local_kv_heads,
    tensor_parallel_size,
)

__all__ = [
    "DistributedRun",
    "ShardPlan",
    "check_tensor_parallel",
    "engine_config",
    "generate_batch",
    "local_kv_heads",
    "plan_shards",
    "run_sharded",
    "tensor_parallel_size",
    "world",
]
