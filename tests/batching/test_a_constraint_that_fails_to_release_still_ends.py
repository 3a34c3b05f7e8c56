"""A constraint's `release` that raises no longer keeps its request running for ever (the end raised inside the
engine loop: a hostile pass, h9, passed the processor CLASS, whose unbound `release` raised TypeError, and
`generate_batch` hung); and a processor class in `SamplingParams.logits_processors` is refused naming the fix."""

from __future__ import annotations

import logging

import pytest

from hf_paged import Engine, PagedConfig, RegexLogitsProcessor, SamplingParams
from hf_paged.errors import InvalidConfigError
from hf_paged.processors.index.index_cache import IndexCache
from tests.batching.test_constrained_engine import model_and_tokenizer


class _FailingRelease(RegexLogitsProcessor):
    def release(self, request_id: str) -> None:
        raise RuntimeError("release failed")


def test_a_request_whose_constraint_fails_to_release_ends(caplog):
    model, tok = model_and_tokenizer()
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
    proc = _FailingRelease(r"[a-h]{3}", tok, index_cache=IndexCache())
    rid = engine.add_request(tok("go ")["input_ids"], SamplingParams(max_new_tokens=8, logits_processors=[proc],
                                                                     eos_token_id=tok.eos_token_id))
    with caplog.at_level(logging.ERROR, logger="hf_paged"):
        for _ in range(40):
            if not engine.has_unfinished:
                break
            engine.step()
    assert not engine.has_unfinished
    assert engine.pop_output(rid).finish_reason == "stop"
    assert "failed to release" in caplog.text
    engine.check_integrity()


def test_a_processor_class_is_refused_naming_an_instance():
    with pytest.raises(InvalidConfigError, match=r"the class RegexLogitsProcessor, not an instance: pass "
                                                 r"RegexLogitsProcessor\(\.\.\.\)"):
        SamplingParams(logits_processors=[RegexLogitsProcessor])
