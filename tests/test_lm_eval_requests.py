"""`PagedLM` on the requests lm-eval's hf backend treats specially: an empty continuation scores (0.0, True) without
ending the run, a continuation longer than max_length is refused by task and document instead of scored in part,
and sampled generate_until requests draw from their own seeds, whatever else runs in the same invocation."""

from __future__ import annotations

import json

import pytest

lm_eval = pytest.importorskip("lm_eval")

import torch
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from hf_paged.api.models import DEFAULT_MODEL_PATH, default_model
from hf_paged.errors import InvalidConfigError, PromptTooLongError, RequestFailedError, UnsupportedModelError
from hf_paged.integrations.lm_eval import ContinuationTooLongError, PagedLM, _refuse_offloaded, request_seeds

MODEL = str(DEFAULT_MODEL_PATH)


@pytest.fixture(scope="module")
def lm() -> PagedLM:
    return PagedLM(pretrained=MODEL, device="cpu", dtype="float32", max_length=64)


def _instance(kind: str, args: tuple, task: str = "t", doc_id: int = 0, idx: int = 0) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=idx, metadata=(task, doc_id, 1))


def test_an_empty_choice_scores_zero_and_greedy_as_the_hf_backend_does(tmp_path):
    """A choice "" after `target_delimiter: ""` ended the whole run ("continuation 6 is empty") where lm-eval's hf
    answers (0.0, True); every sample now equals hf's."""
    data = tmp_path / "mc.jsonl"
    rows = [{"ctx": "the cat sat", "choices": [" on", " mat", " the"], "gold": 1},  # (lm-eval reads doc 0's
            {"ctx": "a dog ran to the", "choices": [" park", "", "a"], "gold": 0},  # first choice; hf answers
            {"ctx": "where birds", "choices": ["", "b", " day"], "gold": 1}]  # "" through a one-token sibling)
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "empty_choice.yaml").write_text(
        "task: h61_empty_choice\ndataset_path: json\n"
        f"dataset_kwargs: {{data_files: {{test: {data}}}}}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{ctx}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: gold\ntarget_delimiter: ''\n"
        "metric_list:\n  - metric: acc\nmetadata: {version: 1.0}\n")

    def evaluate(model: str, **kwargs):
        out = lm_eval.simple_evaluate(model=model, model_args=f"pretrained={MODEL},dtype=float32", device="cpu",
                                      tasks=["h61_empty_choice"], task_manager=TaskManager(include_path=str(tmp_path)),
                                      log_samples=True, **kwargs)
        return [[r[0] for r in sample["resps"]] for sample in out["samples"]["h61_empty_choice"]], out["results"]

    (theirs, their_metrics), (ours, our_metrics) = evaluate("hf", batch_size=4), evaluate("hf-paged")
    assert ours[1][1] == ours[2][0] == (0.0, True)
    for mine, hf in zip(ours, theirs, strict=True):
        for (lp, greedy), (hf_lp, hf_greedy) in zip(mine, hf, strict=True):
            assert lp == pytest.approx(hf_lp, abs=1e-4) and greedy == hf_greedy
    assert our_metrics["h61_empty_choice"]["acc,none"] == their_metrics["h61_empty_choice"]["acc,none"]


def test_an_empty_continuation_never_reaches_the_scoring_api(lm, monkeypatch):
    """Also after an empty context, where lm-eval's own tokenization fails (IndexError) on ("", "")."""
    import hf_paged.integrations.lm_eval as integration

    seen = []
    real = integration.loglikelihood
    monkeypatch.setattr(integration, "loglikelihood", lambda model, pairs, **kw: seen.extend(pairs) or real(
        model, pairs, **kw))
    answers = lm.loglikelihood([_instance("loglikelihood", ("", "")), _instance("loglikelihood", ("a cat", " sat")),
                                _instance("loglikelihood", ("a cat", ""))])
    assert answers[0] == answers[2] == (0.0, True) and answers[1][0] < 0
    assert len(seen) == 1 and all(cont for _, cont in seen)


def test_a_continuation_longer_than_max_length_is_refused_by_task_and_document(lm):
    """hf asserts `len(continuation_enc) <= max_length`; PagedLM scored the last 64 tokens (the same sum for every
    document) with exit 0. Now a typed error naming the task, the document and the request."""
    long_choice = " the cat sat on the mat" * 20
    requests = [_instance("loglikelihood", ("a dog", " ran"), task="mc", doc_id=3),
                _instance("loglikelihood", ("a dog", long_choice), task="mc", doc_id=7, idx=2)]
    with pytest.raises(ContinuationTooLongError, match=r"task 'mc', document 7, request 2 .*max_length is 64") as e:
        lm.loglikelihood(requests)
    assert isinstance(e.value, PromptTooLongError) and e.value.index == 1
    ids = lm.tok_encode(long_choice)
    assert len(ids) > 64
    with pytest.raises(ContinuationTooLongError, match=f"continuation has {len(ids)} tokens"):
        lm._loglikelihood_tokens([(None, [5, 6], ids)])
    # exactly max_length tokens still score (hf's bound), all of them: the window keeps one context token
    (answer,) = lm._loglikelihood_tokens([(None, [5, 6], ids[:64])])
    (shorter,) = lm._loglikelihood_tokens([(None, [5, 6], ids[1:64])])
    assert answer[0] < shorter[0]


def _sampled(task: str, doc_id: int, context: str, repeats: int = 1) -> list[Instance]:
    gen_kwargs = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": True, "temperature": 1.0}
    request = Instance(request_type="generate_until", doc={}, arguments=(context, gen_kwargs), idx=0,
                       metadata=(task, doc_id, repeats))
    return [request] * repeats


def test_sampled_requests_draw_the_same_text_whatever_else_runs(lm):
    """Seeded sampling depended on the other tasks of the run (their prefix hits reordered draws from the global
    generator); each request now has its own seed from lm-eval's torch seed and its place in its task."""
    contexts = ["The cat", "A dog ran to", "Birds sang all", "Where the day"]
    alone = [r for d, c in enumerate(contexts) for r in _sampled("s", d, c)]
    greedy = {"until": ["\n\n"], "max_gen_toks": 6}
    others = [_instance("generate_until", (c + " and more", greedy), task="g", doc_id=d)
              for d, c in enumerate(contexts)] + [r for d, c in enumerate(contexts) for r in _sampled("s2", d, c)]
    torch.manual_seed(1234)
    first = lm.generate_until(alone)
    torch.manual_seed(1234)
    mixed = lm.generate_until(others[:3] + alone[::-1] + others[3:])
    assert mixed[3:3 + len(alone)][::-1] == first
    torch.manual_seed(99)
    assert lm.generate_until(alone) != first  # the seed is lm-eval's torch seed
    torch.manual_seed(1234)
    assert lm.generate_until(alone) == first


def test_request_seeds_key_on_task_document_request_and_repeat():
    a, b = _sampled("s", 0, "x", repeats=2), _sampled("s", 1, "y")
    seeds = request_seeds(a + b, 1234)
    assert seeds[0] != seeds[1]  # the two repeats of one request
    assert request_seeds(b + a, 1234) == seeds[2:] + seeds[:2]
    assert request_seeds(a + b, 1235) != seeds
    assert all(0 <= s < 2**63 for s in seeds)


def test_a_model_offloaded_to_the_meta_device_is_refused_by_argument(lm):
    """`parallelize=True` on a CPU machine: HFLM offloads to disk (parameters on meta) and the engine crashed in
    generate's processor setup; refused now, naming the argument."""
    model = type(lm.model)(lm.model.config)
    with torch.device("meta"):
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight, device="meta"))
    with pytest.raises(UnsupportedModelError, match=r"1 parameters on the meta device.*drop parallelize=True"):
        _refuse_offloaded(model, {"parallelize": True})
    _refuse_offloaded(lm.model, {})


def test_a_failed_generation_names_its_task_and_document():
    """It said "generate_until request 3", an index into lm-eval's reordered list, not a document."""
    small = PagedLM(pretrained=MODEL, device="cpu", dtype="float32", max_length=64, num_blocks=2, block_size=16)
    request = _instance("generate_until", ("a cat sat on the mat " * 2, {"until": ["\n"], "max_gen_toks": 20}),
                        task="g", doc_id=5, idx=1)
    with pytest.raises(RequestFailedError, match=r"generate_until task 'g', document 5, request 1 failed: .*blocks"):
        small.generate_until([request])


@pytest.mark.parametrize(("gen_kwargs", "words"), [
    ({"until": [None]}, r"until must be a string or a list of strings, got \[None\]"),
    ({"until": None}, r"until must be a string or a list of strings, got None"),
    ({"max_gen_toks": 0}, r"max_gen_toks must be >= 1, got 0"),
    ({"max_gen_toks": -1}, r"max_gen_toks must be >= 1, got -1"),
])
def test_a_bad_until_or_max_gen_toks_names_itself_and_the_request(lm, gen_kwargs, words):
    """h8 (F1, F7): until=[None] failed in the engine's stop check (every request of the step FAILED, a
    RequestFailedError); max_gen_toks=0 named SamplingParams.max_new_tokens."""
    request = _instance("generate_until", ("the cat", {"until": ["\n"], "max_gen_toks": 4, **gen_kwargs}),
                        task="g", doc_id=3, idx=1)
    with pytest.raises(InvalidConfigError, match=rf"generate_until task 'g', document 3, request 1: {words}"):
        lm.generate_until([request])


def test_max_length_past_the_models_positions_is_refused():
    """h8 (F4): max_length=200 on a model of 64 positions was accepted; generations then stopped at 64 tokens
    without a word, and a long context raised PromptTooLongError asking to cut what PagedLM cuts itself."""
    model, tok = default_model()
    model.config.max_position_embeddings = 64
    with pytest.raises(InvalidConfigError, match=r"max_length=200 is more than the model's 64 positions.*<= 64"):
        PagedLM(pretrained=model, tokenizer=tok, max_length=200)
    assert PagedLM(pretrained=model, tokenizer=tok, max_length=64).max_length == 64
