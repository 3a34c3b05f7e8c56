"""A streamer given to the patched `generate` sees what stock's sees (found by a hostile pass, h6):
- the same puts: the prompt rows, then one `[rows]` tensor per stock step, each row's token at that position (a row
  that ended gets `pad_token_id`), however the engine spread the rows over its steps (one sequence at a time, a
  small token budget that chunks the prefills);
- its one `end()`, also when the call raises in its up-front checks or in the prompt's put (a
  `TextIteratorStreamer`'s reader would otherwise wait for ever)."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_paged
from hf_paged.errors import InvalidPromptError, PromptTooLongError
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


class Recording:
    """Keeps every put; `fail_at`: the put that raises (counted from 1)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.puts: list[torch.Tensor] = []
        self.ends, self.fail_at = 0, fail_at

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.clone())
        if len(self.puts) == self.fail_at:
            raise KeyError("a streamer bug")

    def end(self) -> None:
        self.ends += 1


@pytest.mark.parametrize("config", [dict(max_num_seqs=1), dict(max_num_seqs=2, max_num_batched_tokens=8)])
@pytest.mark.parametrize("with_eos", [False, True])
def test_the_puts_are_stocks_when_rows_run_in_other_steps(config, with_eos):
    stock = tiny_model("llama")
    model = hf_paged.wrap(copy.deepcopy(stock), num_blocks=64, **config)
    ids, mask = left_pad(ragged_prompts([6, 17, 4], seed=4))
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False)
    if with_eos:  # row 0 ends at its third token: stock pads it from there on, and the others go on
        kwargs["eos_token_id"] = stock.generate(ids, **kwargs)[0, ids.shape[1] + 2].item()
    want, got = Recording(), Recording()
    expected = stock.generate(ids, streamer=want, **kwargs)
    out = model.generate(ids, streamer=got, **kwargs)
    assert torch.equal(out, expected)
    assert len(got.puts) == len(want.puts) == expected.shape[1] - ids.shape[1] + 1
    assert all(torch.equal(a, b) for a, b in zip(got.puts, want.puts)), ([p.tolist() for p in got.puts],
                                                                       [p.tolist() for p in want.puts])
    assert got.ends == want.ends == 1


@pytest.fixture(scope="module")
def small():
    return hf_paged.wrap(tiny_model("llama"), block_size=4, num_blocks=20)


@pytest.mark.parametrize("error, kwargs", [
    (InvalidPromptError, dict(input_ids=torch.tensor([[5, 500]]))),  # outside the vocabulary
    (InvalidPromptError, dict(input_ids=torch.tensor([[5, 6], [0, 0]]), attention_mask=torch.tensor([[1, 1], [0, 0]]))),
    (PromptTooLongError, dict(input_ids=torch.full((1, 100), 7))),  # beyond the pool
    (ValueError, dict(input_ids=torch.tensor([[5, 6]]), attention_mask=torch.tensor([[1]]))),
])
def test_end_is_called_when_an_up_front_check_raises(small, error, kwargs):
    streamer = Recording()
    with pytest.raises(error):
        small.generate(max_new_tokens=3, streamer=streamer, **kwargs)
    assert streamer.ends == 1 and streamer.puts == []


def test_end_is_called_when_the_prompts_put_raises(small):
    streamer = Recording(fail_at=1)
    with pytest.raises(KeyError):
        small.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, streamer=streamer)
    assert streamer.ends == 1 and len(streamer.puts) == 1
    assert not hf_paged.engine_of(small).requests  # nothing ran
