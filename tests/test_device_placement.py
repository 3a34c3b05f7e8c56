"""Tensors and generators the package makes land on the device of the tensors they meet (issue 36, point 3).

On a CPU machine a CPU generator drawing from CPU probabilities, or a CPU index tensor selecting CPU rows, works
by accident; on CUDA the same line raises. These checks read the source, so they fail on such a mistake here,
without a GPU (`tests/gpu/` runs the same paths on one):
- every `torch.Generator(...)` names its `device=`;
- a random draw that makes a new tensor with a `generator=` (`torch.rand`, `randn`, ...) names its `device=`;
- only `Request.generator_on(device)` reads a request's generator (it makes it on the device it is asked for);
- an index tensor built in the argument list of `index_select` / `index_copy_` / ... names its `device=`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import hf_paged
from hf_paged.batching.request import Request
from hf_paged.batching.sampling import SamplingParams

PACKAGE = Path(hf_paged.__file__).parent
NEW_RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "empty", "normal"}
INDEXING = {"index_select", "index_copy_", "index_copy", "index_add_", "index_fill_", "gather", "scatter_",
            "scatter", "take", "index_put_"}


def _calls():
    """(path, node) for every call in the package, and every `.generator` attribute outside `batching/request.py`
    (the one place that makes and hands out a request's generator)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        owner = path.name == "request.py" and path.parent.name == "batching"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            generator = isinstance(node, ast.Attribute) and node.attr == "generator" and not owner
            if isinstance(node, ast.Call) or generator:
                yield path.relative_to(PACKAGE.parent), node


def _torch_fn(call: ast.Call) -> str | None:
    """`name` for a call `torch.name(...)`, else None."""
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch":
        return f.attr
    return None


def _keywords(call: ast.Call) -> set[str | None]:
    return {k.arg for k in call.keywords}


def test_generators_and_new_random_tensors_name_their_device():
    bad = []
    for path, node in _calls():
        if isinstance(node, ast.Attribute):
            if not isinstance(node.ctx, ast.Store):
                bad.append(f"{path}:{node.lineno}: reads `.generator`; use `request.generator_on(logits.device)`")
            continue
        name, keywords = _torch_fn(node), _keywords(node)
        if name == "Generator" and "device" not in keywords:
            bad.append(f"{path}:{node.lineno}: torch.Generator() without device=")
        if name in NEW_RANDOM and "generator" in keywords and "device" not in keywords:
            bad.append(f"{path}:{node.lineno}: torch.{name}(generator=...) without device=")
    assert not bad, "\n".join(bad)


def test_index_tensors_built_for_indexing_name_their_device():
    bad = []
    for path, node in _calls():
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in INDEXING):
            continue
        for arg in node.args:
            if isinstance(arg, ast.Call) and _torch_fn(arg) in {"tensor", "as_tensor", "arange"} \
                    and "device" not in _keywords(arg):
                bad.append(f"{path}:{node.lineno}: {node.func.attr}(torch.{_torch_fn(arg)}(...)) without device=")
    assert not bad, "\n".join(bad)


def test_a_request_makes_its_generator_on_the_device_asked_and_keeps_it():
    request = Request("r", [1, 2], SamplingParams(do_sample=True, seed=5))
    g = request.generator_on(torch.device("cpu"))
    assert g is not None and g.device == torch.device("cpu") and request.generator_on("cpu") is g
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=torch.Generator().manual_seed(5)))
    fork = Request("r#1", [1, 2], SamplingParams(do_sample=True, seed=5))
    fork.seed = 6  # a fork's or a retry's own seed wins over the request's
    assert torch.equal(torch.rand(3, generator=fork.generator_on("cpu")),
                       torch.rand(3, generator=torch.Generator().manual_seed(6)))
    assert Request("u", [1], SamplingParams(do_sample=True)).generator_on("cpu") is None  # no seed: global


def test_a_generator_asked_for_on_another_device_is_refused():
    request = Request("r", [1, 2], SamplingParams(do_sample=True, seed=5))
    request.generator_on("cpu")
    try:
        request.generator_on("meta")
    except RuntimeError as exc:
        assert "one device" in str(exc)
    else:
        raise AssertionError("a generator on cpu was handed out for meta tensors")
