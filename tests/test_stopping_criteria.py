"""Stopping criteria and stop strings on the paged engine, token-identical to stock `generate` (issue 44, point 1)."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MaxLengthCriteria, StoppingCriteria, StoppingCriteriaList

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning
from hf_paged.errors import StoppingCriterionError
from tests.tiny_models import byte_tokenizer, left_pad, ragged_prompts, tiny_model

LENGTHS = [3, 17, 33, 8]


class StopAfterToken(StoppingCriteria):
    """Done when the row's last token is `token` (per-row state by batch index, like lm-eval's criterion)."""

    def __init__(self, token: int, prompt_len: int) -> None:
        self.token, self.prompt_len, self.done = token, prompt_len, {}

    def __call__(self, input_ids, scores, **kwargs):
        out = []
        for i, row in enumerate(input_ids[:, self.prompt_len:].tolist()):
            self.done[i] = self.done.get(i, False) or (bool(row) and row[-1] == self.token)
            out.append(self.done[i])
        return torch.tensor(out, dtype=torch.bool, device=input_ids.device)


class WrongShape(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0] + 1, dtype=torch.bool)


class Boom(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        raise ZeroDivisionError("criterion bug")


def _byte_llama(tok, seed: int):
    """A tiny random Llama over `tok`'s byte vocabulary, whose EOS (and padding) is the tokenizer's."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)).eval()


def _both(model, ids, mask, kwargs):
    """Stock output, then the wrapped model's, for the same call (`kwargs()` makes fresh criteria each time)."""
    stock = model.generate(ids, attention_mask=mask, do_sample=False, **kwargs())
    hf_paged.wrap(model, block_size=8, max_num_batched_tokens=32)  # chunked prefill: rows run out of step
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)  # the engine ran, no fallback
            paged = model.generate(ids, attention_mask=mask, do_sample=False, **kwargs())
        engine = hf_paged.engine_of(model)
        engine.check_integrity()
        assert not engine.requests and engine.cache.pool.num_used_blocks == 0
    finally:
        hf_paged.unwrap(model)
    return stock, paged


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("eos", [None, 2], ids=["no EOS: stopped rows keep generating", "EOS: stopped rows pad"])
def test_custom_criteria_with_per_row_state_match_stock(family, eos):
    model = tiny_model(family)
    ids, mask = left_pad(ragged_prompts(LENGTHS))
    stock_out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    token = int(stock_out[1, ids.shape[1] + 4])  # row 1's fifth token: a row stops mid-way, others may too

    def kwargs():
        return {"max_new_tokens": 12, "eos_token_id": eos, "pad_token_id": 0,
                "stopping_criteria": StoppingCriteriaList([StopAfterToken(token, ids.shape[1])])}

    stock, paged = _both(model, ids, mask, kwargs)
    if eos is not None:  # row 1 stopped after its fifth token at the latest: padded from there
        assert (stock[1, ids.shape[1] + 5:] == 0).all()
    assert torch.equal(paged, stock)


def test_stop_strings_and_max_length_criterion_match_stock():
    tok = byte_tokenizer()
    model = _byte_llama(tok, seed=0)
    ids, mask = left_pad([tok(t)["input_ids"] for t in ("Once upon", "a", "The quick brown fox")],
                         pad=tok.eos_token_id)
    first = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                           pad_token_id=tok.eos_token_id)
    row = first[0, ids.shape[1]:].tolist()
    at = next(i for i, t in enumerate(row) if i >= 2 and chr(32) <= tok.decode([t]) <= chr(126))
    stop = tok.decode([row[at]])  # an ASCII character row 0 produces mid-way
    stock, paged = _both(model, ids, mask, lambda: {"max_new_tokens": 16, "stop_strings": [stop], "tokenizer": tok,
                                                    "pad_token_id": tok.eos_token_id})
    assert (stock[0, ids.shape[1] + at + 1:] == tok.eos_token_id).all()  # row 0 stopped at its stop string
    assert torch.equal(paged, stock)
    stock, paged = _both(model, ids, mask, lambda: {
        "max_new_tokens": 16, "pad_token_id": tok.eos_token_id,
        "stopping_criteria": StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + 5)])})
    assert stock.shape[1] == ids.shape[1] + 5 and torch.equal(paged, stock)


def test_lm_evals_own_stop_sequence_criterion_matches_stock():
    """lm-eval's `MultiTokenEOSCriteria` (per-row state by batch index, reads `input_ids[:, prompt_length:]`), as its
    HF backend builds it for every generate_until batch."""
    utils = pytest.importorskip("lm_eval.models.utils_hf")
    tok = byte_tokenizer()
    ids, mask = left_pad([tok(t)["input_ids"] for t in ("Once upon", "a", "The quick brown fox", "x = 1")],
                         pad=tok.eos_token_id)
    for seed in range(20):  # a random model whose rows all produce one ASCII character within 24 tokens
        model = _byte_llama(tok, seed)
        first = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                               pad_token_id=tok.eos_token_id)
        # its criterion is met when every row's recent text holds the sequence
        seen = [{tok.decode([t]) for t in row[2:24]} for row in first[:, ids.shape[1]:].tolist()]
        common = sorted(c for c in set.intersection(*seen) if len(c) == 1 and " " <= c <= "~")
        if common:
            break
    text = common[0]

    def kwargs():
        criteria = utils.stop_sequences_criteria(tok, [text, "<eos>"], ids.shape[1], ids.shape[0])
        return {"max_new_tokens": 30, "stopping_criteria": criteria, "pad_token_id": tok.eos_token_id}

    stock, paged = _both(model, ids, mask, kwargs)
    assert stock.shape[1] < ids.shape[1] + 30  # the criterion ended the batch before max_new_tokens
    assert torch.equal(paged, stock)


def test_a_criterion_that_raises_is_named_and_leaves_the_engine_usable():
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts(LENGTHS))
    hf_paged.wrap(model, block_size=8)
    try:
        with pytest.raises(StoppingCriterionError, match="Boom.*ZeroDivisionError: criterion bug"):
            model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                           stopping_criteria=StoppingCriteriaList([Boom()]))
        with pytest.raises(StoppingCriterionError, match="WrongShape.*must match the size"):
            model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                           stopping_criteria=StoppingCriteriaList([WrongShape()]))
        engine = hf_paged.engine_of(model)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        assert out.shape == (len(LENGTHS), ids.shape[1] + 8)
        engine.check_integrity()
        assert not engine.requests and engine.cache.pool.num_used_blocks == 0
    finally:
        hf_paged.unwrap(model)


def test_generate_batch_takes_stop_strings_with_a_tokenizer():
    from transformers import GenerationConfig

    model, tok = hf_paged.default_model()
    hf_paged.wrap(model)
    try:
        prompt = tok("def main():")["input_ids"]
        full = model.generate_batch([prompt], GenerationConfig(max_new_tokens=24, do_sample=False))["req_0"]
        text = tok.decode(full.generated_tokens)
        stop = text.strip()[:2]
        config = GenerationConfig(max_new_tokens=24, do_sample=False, stop_strings=[stop])
        out = model.generate_batch([prompt], config, tokenizer=tok)["req_0"]
        assert out.finish_reason == "stop" and stop in tok.decode(out.generated_tokens)
        assert len(out.generated_tokens) < len(full.generated_tokens)
    finally:
        hf_paged.unwrap(model)


def test_stop_strings_with_a_streamer_fall_back_to_stock():
    from transformers import TextStreamer

    model, tok = hf_paged.default_model()
    hf_paged.wrap(model)
    try:
        batch = tok(["def main():"], return_tensors="pt")
        with pytest.warns(PagedFallbackWarning, match="stopping criteria with a streamer"):
            model.generate(**batch, max_new_tokens=8, stop_strings=["\n"], tokenizer=tok,
                           streamer=TextStreamer(tok))
    finally:
        hf_paged.unwrap(model)


class AllDoneAfter(StoppingCriteria):
    """Every row done once the batch has `steps` new tokens: a verdict per row, or one bool for all (a 1-element
    tensor, which stock's `StoppingCriteriaList` broadcasts over the rows)."""

    def __init__(self, prompt_len: int, steps: int, per_row: bool) -> None:
        self.length, self.per_row = prompt_len + steps, per_row

    def __call__(self, input_ids, scores, **kwargs):
        rows = input_ids.shape[0] if self.per_row else 1
        return torch.full((rows,), input_ids.shape[1] >= self.length, dtype=torch.bool)


@pytest.mark.parametrize("per_row", [True, False], ids=["a verdict per row", "one verdict for all rows"])
def test_a_row_that_ran_ahead_is_cut_back_to_the_step_where_all_stopped(per_row):
    """No EOS criterion, so a stopped row keeps its real tokens; the short row decodes while the long one is still
    in chunked prefill (32 tokens a step), so it holds several tokens more than step 3 when the criterion stops
    everyone there: it must be cut back to 3, as stock returns it."""
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts([3, 160]))

    def kwargs():
        return {"max_new_tokens": 12, "eos_token_id": None, "pad_token_id": 0,
                "stopping_criteria": StoppingCriteriaList([AllDoneAfter(ids.shape[1], 3, per_row)])}

    stock, paged = _both(model, ids, mask, kwargs)
    assert stock.shape[1] == ids.shape[1] + 3
    assert torch.equal(paged, stock)


class LastColumn(StoppingCriteria):
    """Never stops; records the column stock's loop appended at each call."""

    def __init__(self) -> None:
        self.columns: list[list[int]] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.columns.append(input_ids[:, -1].tolist())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def test_a_row_stopped_early_is_padded_in_the_input_ids_the_criteria_see():
    """With an EOS criterion in the list stock pads a finished row: the criteria see `pad_token_id` in its column
    from the next step on. The short row runs ahead during the long row's chunked prefill and is stopped by a
    criterion (not by EOS) at its second token, so the engine holds real tokens for it beyond that step: the replayed
    columns must still show the pad, call for call as stock shows them."""
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts([3, 160]))
    stock_out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8, pad_token_id=0)
    token = int(stock_out[0, ids.shape[1] + 1])  # the short row's second token
    recorders: list[LastColumn] = []

    def kwargs():
        recorders.append(LastColumn())
        return {"max_new_tokens": 8, "eos_token_id": 2, "pad_token_id": 0,
                "stopping_criteria": StoppingCriteriaList([StopAfterToken(token, ids.shape[1]), recorders[-1]])}

    stock, paged = _both(model, ids, mask, kwargs)
    stock_columns, paged_columns = (r.columns for r in recorders)
    assert [column[0] for column in stock_columns[2:]] == [0] * (len(stock_columns) - 2)  # padded from step 3 on
    assert len(stock_columns) > 2 and paged_columns == stock_columns
    assert torch.equal(paged, stock)


class RepeatsInScores(StoppingCriteria):
    """Reads the `scores` stock's loop passes: a row is done once its last two steps' argmax agree (raises when they
    are missing); records what it saw."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor | None] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.seen.append(None if scores is None else torch.stack(scores).clone())
        if scores is None or len(scores) < 2:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        return scores[-1].argmax(-1) == scores[-2].argmax(-1)


@pytest.mark.parametrize("output_scores", [True, False])
def test_criteria_get_the_scores_stock_passes(output_scores):
    """Stock passes its `scores` tuple (one processed `[rows, vocab]` row per step so far) to the criteria when the
    call returns scores, else None; the replay passed None always (found by a hostile pass, session 30). The rows
    run out of step (chunked prefill); no EOS, so no row is padded and every score is a real one."""
    model = tiny_model("llama")
    ids, mask = left_pad(ragged_prompts([3, 60, 17]))
    recorders: list[RepeatsInScores] = []

    def kwargs():
        recorders.append(RepeatsInScores())
        return {"max_new_tokens": 10, "eos_token_id": None, "pad_token_id": 0, "output_scores": output_scores,
                "return_dict_in_generate": True, "stopping_criteria": StoppingCriteriaList([recorders[-1]])}

    stock, paged = _both(model, ids, mask, kwargs)
    assert torch.equal(paged.sequences, stock.sequences)
    stock_seen, paged_seen = (r.seen for r in recorders)
    assert len(paged_seen) == len(stock_seen) > 1
    if not output_scores:
        assert stock_seen == paged_seen == [None] * len(stock_seen)
        return
    for at, (mine, theirs) in enumerate(zip(paged_seen, stock_seen)):
        assert mine.shape == theirs.shape == (at + 1, 3, model.config.vocab_size)
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.stack(paged.scores), torch.stack(stock.scores), rtol=1e-4, atol=1e-4)


class LastTokenIs(StoppingCriteria):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_criteria_with_assisted_decoding_of_one_row_run_stock():
    """Stock's assisted decoding checks the criteria once per accepted draft (a last-token check can be stepped
    over); the engine checked them per token: another answer, no warning (found by a hostile pass, session 30).
    One row runs stock now; several rows (stock's assisted decoding takes one) stay on the engine."""
    import copy

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                         eos_token_id=2)
    stock = LlamaForCausalLM(config).eval()
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    prompt = stock.generate(torch.tensor([[10, 11, 12]]), max_new_tokens=9, pad_token_id=0)  # a cycle to look up
    kwargs = dict(max_new_tokens=12, pad_token_id=0, prompt_lookup_num_tokens=4)
    cycle = prompt[0, 3:].tolist()
    expected = stock.generate(prompt, stopping_criteria=[LastTokenIs(cycle[1])], **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = wrapped.generate(prompt, stopping_criteria=[LastTokenIs(cycle[1])], **kwargs)
    fallbacks = [w for w in caught if issubclass(w.category, PagedFallbackWarning)]
    assert len(fallbacks) == 1 and "assisted decoding" in str(fallbacks[0].message)
    assert torch.equal(out, expected)
