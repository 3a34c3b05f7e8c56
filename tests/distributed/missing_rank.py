"""The rank side of `test_missing_rank`: rank 0 calls `hf_paged.distributed.generate_batch`, rank 1 never does (it
waits for rank 0's verdict file, then leaves). Launched as `torchrun --standalone --nproc_per_node 2 -m
tests.distributed.missing_rank OUT_DIR`; each rank writes OUT_DIR/rank<r>.json."""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import hf_paged
from hf_paged.distributed import generate_batch
from tests.tiny_models import tiny_model


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))  # (the bound of the wait under test)
    rank = dist.get_rank()
    model = hf_paged.wrap(tiny_model("llama"), block_size=4)
    result: dict = {"rank": rank}
    if rank == 0:
        try:
            generate_batch(model, [[3, 4, 5], [6, 7, 8, 9]], max_new_tokens=2)
            result["error"] = None
        except Exception as error:  # noqa: BLE001 -- recorded for the test
            result["error"] = type(error).__name__
            result["message"] = str(error)
    else:  # never calls generate_batch; stays alive until rank 0 has its answer (at most 5 minutes)
        deadline = time.monotonic() + 300
        while not (out / "rank0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
