"""`generate_batch`'s outputs carry what transformers' `GenerationOutput` does: `timestamps` with
`record_timestamps=True` (one `time.perf_counter()` per generated token, in order), None without."""

from __future__ import annotations

import time

from transformers import GenerationConfig

import hf_paged
from tests.tiny_models import tiny_model


def test_record_timestamps_gives_one_time_per_token():
    model = hf_paged.wrap(tiny_model("llama"))
    started = time.perf_counter()
    outputs = model.generate_batch([[1, 2, 3], [4, 5]], GenerationConfig(max_new_tokens=5, do_sample=True,
                                                                          num_return_sequences=2),
                                   record_timestamps=True)
    assert len(outputs) == 4
    for output in outputs.values():
        times = output.timestamps
        assert len(times) == len(output.generated_tokens) and times == sorted(times)
        assert started <= times[0] and times[-1] <= time.perf_counter()
    plain = model.generate_batch([[1, 2, 3]], GenerationConfig(max_new_tokens=3))
    assert [o.timestamps for o in plain.values()] == [None]
    hf_paged.unwrap(model)
