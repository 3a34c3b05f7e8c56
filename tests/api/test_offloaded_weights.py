"""Models whose weights accelerate offloads (`cpu_offload`, `disk_offload`, a `device_map` with "disk" entries): the
parameters sit on the meta device and hooks load them around each module's forward. Stock `generate` runs them; the
engine placed its input ids and special tokens on the meta device ("Cannot copy out of meta tensor") because it took
the device of the first parameter. It now takes the device the hooks compute on (`compat.execution_device`)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning
from hf_paged.api.wrap_state import engine_of
from hf_paged.compat import execution_device
from tests.tiny_models import tiny_model

accelerate = pytest.importorskip("accelerate")


def _offloaded(model, kind: str, folder: str):
    if kind == "cpu_offload":
        return accelerate.cpu_offload(model, execution_device="cpu")
    if kind == "disk_offload":
        return accelerate.disk_offload(model, folder, execution_device="cpu")
    device_map = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    return accelerate.dispatch_model(model, device_map=device_map, offload_dir=folder)


@pytest.mark.parametrize("kind", ["cpu_offload", "disk_offload", "device_map_with_disk"])
def test_offloaded_weights_run_on_the_engine_as_stock(kind, tmp_path):
    base = tiny_model("llama")
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17]])
    mask = (ids != 0).long()
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    ref = base.generate(ids, attention_mask=mask, **kwargs)
    model = _offloaded(copy.deepcopy(base), kind, str(tmp_path))
    assert any(p.is_meta for p in model.parameters())
    assert execution_device(model) == torch.device("cpu")
    hf_paged.wrap(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)  # the engine, not a fallback
            out = model.generate(ids, attention_mask=mask, **kwargs)
        assert torch.equal(out, ref)
        batch = model.generate_batch([[5, 6, 7, 8, 9], ids[1].tolist()], max_new_tokens=8)
        assert [o.generated_tokens for o in batch.values()] == [ref[0, 7:].tolist(), ref[1, 7:].tolist()]
        assert engine_of(model).stats()["steps"] > 0
    finally:
        hf_paged.unwrap(model)


def test_execution_device_of_a_plain_model_is_its_first_parameters():
    model = tiny_model("llama")
    assert execution_device(model) == next(model.parameters()).device
