"""The batching <-> processors contract: a declared `RequestConstraint`, stock processors through `RowProcessor`,
and failures that carry their exception class (issue 19)."""

import ast
import pickle
from pathlib import Path

import pytest
import torch
from transformers import LogitsProcessor, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

import hf_paged
from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.batching.constraint_protocol import RequestConstraint, RequestProcessors, RowProcessor, is_constraint
from hf_paged.batching.request import Request, RequestOutput
from hf_paged.errors import RequestFailedError, SchemaTooComplexError
from tests.tiny_models import ragged_prompts, tiny_model

BATCHING = Path(__file__).resolve().parents[2] / "hf_paged" / "batching"


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


class Script:
    """A constraint of our own kind, written against the protocol only: the output must start with `script`."""

    supports_continuous_batching = True

    def __init__(self, script: list[int], *, force: bool = True, fail: bool = False) -> None:
        self.script, self.force, self.fail = script, force, fail
        self.prepared = 0
        self.released: list[str] = []

    def prepare(self) -> None:
        self.prepared += 1

    def process_rows(self, request_ids, generated, scores):
        if self.fail:
            raise SchemaTooComplexError("script too long")
        for row, gen in enumerate(generated):
            if len(gen) < len(self.script):
                keep = scores[row, self.script[len(gen)]].clone()
                scores[row] = float("-inf")
                scores[row, self.script[len(gen)]] = keep
        return scores

    def allows(self, request_id, generated, token_id):
        return len(generated) >= len(self.script) or token_id == self.script[len(generated)]

    def forced_tokens(self, request_id, generated, max_tokens):
        return self.script[len(generated):][:max_tokens] if self.force else []

    def is_complete(self, request_id, generated=None):
        return False  # the script never ends a document: every cut is incomplete

    def error(self, request_id):
        return None  # it never gives up on a document

    def release(self, request_id):
        self.released.append(request_id)

    def __call__(self, input_ids, scores):  # stock generate's entry: the engine must never use it
        raise AssertionError("the engine called a constraint as a stock processor")


def test_processors_are_sorted_once_into_constraints_and_row_processors():
    script, temp = Script([1]), TemperatureLogitsWarper(0.5)
    assert isinstance(script, RequestConstraint) and is_constraint(script)
    sorted_ = RequestProcessors.of([temp, script])
    assert sorted_.constraints == (script,)
    assert [p.processor for p in sorted_.row_processors] == [temp]
    assert isinstance(sorted_.row_processors[0], RowProcessor)
    assert not RequestProcessors.of([]) and RequestProcessors.of([temp])

    class NotDeclared(Script):
        supports_continuous_batching = False

    class Partial(LogitsProcessor):  # declares the flag but implements only part of the protocol
        supports_continuous_batching = True

        def process_rows(self, request_ids, generated, scores):
            return scores

        def __call__(self, input_ids, scores):
            return scores

    assert not is_constraint(NotDeclared([1])) and not is_constraint(Partial())
    assert not RequestProcessors.of([Partial()]).constraints
    request = Request("a", [1, 2], SamplingParams(logits_processors=[script, temp]))
    assert request.processors.constraints == (script,)  # sorted when the request is made


def test_a_protocol_constraint_is_driven_by_the_engine(model):
    prompts = ragged_prompts([5, 9], seed=3)
    script = [7, 8, 9, 10]
    outs = {}
    for force in (False, True):
        engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
        constraint = Script(script, force=force)
        params = SamplingParams(max_new_tokens=8, logits_processors=[constraint])  # (alone: other processors turn
        # jump-forward off, as they may ban the forced token)
        ids = [engine.add_request(p, params) for p in prompts]
        assert constraint.prepared == 2  # compile started when each request was added
        while engine.has_unfinished:
            engine.step()
            engine.check_integrity()
        outs[force] = [engine.pop_output(i) for i in ids]
        assert sorted(constraint.released) == sorted(ids)  # every request's state freed at its end
        assert engine.stats()["forced_tokens"] == (6 if force else 0)
    for plain, forced in zip(outs[False], outs[True]):
        assert plain.generated_tokens[:4] == script
        assert forced.generated_tokens == plain.generated_tokens  # jump-forward gives what decoding gives
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))  # beside a stock processor: a step a token
    params = SamplingParams(max_new_tokens=8, logits_processors=[Script(script, force=True),
                                                                 RepetitionPenaltyLogitsProcessor(1.3)])
    out = engine.run([engine.add_request(prompts[0], params)])
    assert next(iter(out.values())).generated_tokens[:4] == script and engine.stats()["forced_tokens"] == 0


def test_a_document_cut_short_ends_length_incomplete(model):
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
    rid = engine.add_request([3, 4, 5], SamplingParams(max_new_tokens=2, logits_processors=[Script([7, 8, 9])]))
    out = engine.run([rid])[rid]
    assert out.finish_reason == "length_incomplete" and out.generated_tokens == [7, 8]


class Raising(LogitsProcessor):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __call__(self, input_ids, scores):
        raise self.error


def test_failures_carry_their_exception_class(model):
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
    ids = {
        "typed": engine.add_request([4, 5], SamplingParams(logits_processors=[Raising(SchemaTooComplexError("x"))])),
        "foreign": engine.add_request([4, 6], SamplingParams(logits_processors=[Raising(KeyError("k"))])),
        "constraint": engine.add_request([4, 7], SamplingParams(logits_processors=[Script([1], fail=True)])),
        "empty": engine.add_request([], SamplingParams()),
        "good": engine.add_request([4, 8], SamplingParams(max_new_tokens=3)),
    }
    outs = {name: o for name, o in zip(ids, engine.run(list(ids.values())).values())}
    assert outs["typed"].error_type is SchemaTooComplexError and "SchemaTooComplexError: x" in outs["typed"].error
    assert outs["foreign"].error_type is KeyError
    assert outs["constraint"].error_type is SchemaTooComplexError and "script too long" in outs["constraint"].error
    assert outs["empty"].error_type is hf_paged.errors.InvalidPromptError
    assert outs["good"].status is RequestStatus.FINISHED and outs["good"].error_type is None
    rid = engine.add_request([4, 9], SamplingParams())
    engine.abort(rid)
    assert engine.pop_output(rid).error_type is RequestFailedError


def test_generate_raises_the_failure_class(model):
    hf_paged.wrap(model, block_size=4, num_blocks=64)
    try:
        with pytest.raises(SchemaTooComplexError, match="request req_.* failed: .*too big"):
            model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2,
                           logits_processor=[Raising(SchemaTooComplexError("too big"))])
        with pytest.raises(RequestFailedError, match="logits processor failed: KeyError"):
            model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, logits_processor=[Raising(KeyError("k"))])
    finally:
        hf_paged.unwrap(model)


def test_an_output_with_a_local_exception_class_still_pickles():
    class Local(Exception):
        pass

    out = RequestOutput("a", [1], [], RequestStatus.FAILED, error="Local: x", error_type=Local)
    back = pickle.loads(pickle.dumps(out))
    assert back.error_type is RequestFailedError and back.error == "Local: x" and back.request_id == "a"
    typed = RequestOutput("b", [1], [2], RequestStatus.FAILED, error="e", error_type=SchemaTooComplexError)
    assert pickle.loads(pickle.dumps(typed)) == typed


def _probes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")]


def test_the_engine_and_sampler_never_probe_processors():
    files = [BATCHING / "engine.py", BATCHING / "sampler.py", BATCHING / "lifecycle.py", BATCHING / "appending.py",
             BATCHING / "constraint_modes.py", *sorted((BATCHING / "speculative").glob("*.py"))]
    assert [p for f in files for p in _probes(f)] == []


def test_batching_modules_stay_small():
    sizes = {p.relative_to(BATCHING).as_posix(): len(p.read_text().splitlines()) for p in BATCHING.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}
