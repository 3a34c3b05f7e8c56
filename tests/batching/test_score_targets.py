"""A scoring request's targets are checked like prompt ids: a bad one fails alone, its neighbours are unharmed."""

import hf_paged
from hf_paged import PagedConfig, RequestStatus, SamplingParams
from tests.tiny_models import tiny_model


def test_a_score_target_outside_the_vocabulary_fails_alone():
    model = hf_paged.wrap(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=32))
    vocab = model.config.vocab_size
    outs = hf_paged.engine_of(model).loop.submit(
        [[5, 6, 7], [5, 6, 7]],
        [SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=1, score_targets=[vocab + 10])],
    ).result()
    good, bad = outs.values()  # the last target is not a prompt id: checked on its own (it crashed the step)
    assert good.status == RequestStatus.FINISHED and len(good.generated_tokens) == 4
    assert bad.status == RequestStatus.FAILED
    assert f"score target {vocab + 10} is outside the vocabulary [0, {vocab})" in bad.error
