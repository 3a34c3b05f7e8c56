"""Shape engine outputs as stock `generate` returns them, and feed a `streamer` as stock `generate` does."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hf_paged.batching.request import RequestOutput


def assemble_generate_output(
    input_ids: torch.Tensor, outputs: list[RequestOutput], generation_config: GenerationConfig,
    pad_token_id: int, vocab_size: int, scores: list[list[torch.Tensor]] | None = None,
    logits: list[list[torch.Tensor]] | None = None,
):
    """`input_ids` [rows, padded_len] (left padding kept) + generated tokens, rows that ended early padded with
    `pad_token_id`; with `return_dict_in_generate`, a `GenerateDecoderOnlyOutput` whose `scores`/`logits` hold one
    `[rows, vocab]` tensor per step (a row that had already ended shows -inf with 0 at `pad_token_id`, so its
    argmax is the pad it got)."""
    rows, prompt_len = input_ids.shape
    max_new = max((len(o.generated_tokens) for o in outputs), default=0)
    dtype = torch.promote_types(input_ids.dtype, torch.long) if max_new else input_ids.dtype  # stock's cat promotes
    sequences = torch.full((rows, prompt_len + max_new), pad_token_id, dtype=dtype, device=input_ids.device)
    sequences[:, :prompt_len] = input_ids
    for i, out in enumerate(outputs):
        if out.generated_tokens:
            sequences[i, prompt_len : prompt_len + len(out.generated_tokens)] = torch.tensor(out.generated_tokens)
    if not generation_config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=_per_step(scores, max_new, pad_token_id, vocab_size, input_ids.device)
        if generation_config.output_scores else None,
        logits=_per_step(logits, max_new, pad_token_id, vocab_size, input_ids.device)
        if getattr(generation_config, "output_logits", False) else None,
    )


def _per_step(per_row: list[list[torch.Tensor]] | None, steps: int, pad: int, vocab: int, device) -> tuple:
    if per_row is None:
        return None
    filler = torch.full((vocab,), float("-inf"), device=device)
    filler[pad] = 0.0
    out = []
    for t in range(steps):
        out.append(torch.stack([r[t].to(device) if t < len(r) else filler for r in per_row]))
    return tuple(out)


class StreamEnd:
    """Calls `streamer.end()` at most once, and never once the call went to stock generate (`to_stock`)."""

    def __init__(self, streamer) -> None:
        self.streamer, self.pending = streamer, streamer is not None

    def to_stock(self):
        self.pending = False
        return self.streamer

    def end(self) -> None:
        if self.pending:
            self.pending = False
            self.streamer.end()


def make_streamer_hook(streamer, order: list[str], pad_token_id: int, assisted: bool = False) -> Callable | None:
    """Feed `streamer` the new tokens as stock generate does, after the prompt (put by the caller): one `[rows]`
    tensor per stock step (`StreamReplay`); `assisted` (one row, as stock's assisted decoding takes): one `[1, k]`
    tensor of the tokens a step accepted."""
    if streamer is None:
        return None
    if not assisted:
        return StreamReplay(streamer, order, pad_token_id).on_step

    def on_step(step) -> None:
        new = step.new_tokens.get(order[0], [])
        if new:
            streamer.put(torch.tensor([new]))

    return on_step


class StreamReplay:
    """Stock's puts, replayed over the engine's steps (as `LockstepCriteria` replays its stopping checks).

    Stock advances every row one token a step and puts each step's `[rows]` tensor: row i's k-th new token, or
    `pad_token_id` for a row that already ended; its loop, and so its puts, end when every row has. The engine runs
    rows at their own pace (a row waits for a slot, a chunked prefill, another row's prefix blocks; assisted rows
    accept different numbers of drafts), so position k is put once every row has its k-th token or has ended:
    the same number of puts, and the same tensors, as stock's (found by a hostile pass: pads mid-row, extra puts)."""

    def __init__(self, streamer, order: list[str], pad_token_id: int) -> None:
        self.streamer, self.pad = streamer, pad_token_id
        self.row_of = {rid: i for i, rid in enumerate(order)}
        self.tokens: list[list[int]] = [[] for _ in order]
        self.ended = [False] * len(order)
        self.num_puts = 0  # token positions put so far

    def on_step(self, step) -> None:
        for rid, new in step.new_tokens.items():
            self.tokens[self.row_of[rid]].extend(new)
        for out in step.finished:
            self.ended[self.row_of[out.request_id]] = True
        while self._ready(self.num_puts):
            k = self.num_puts
            self.num_puts = k + 1
            self.streamer.put(torch.tensor([t[k] if k < len(t) else self.pad for t in self.tokens]))

    def _ready(self, k: int) -> bool:
        """Every row has its token k or has ended, and some row has one (else stock's loop ended before k)."""
        return all(len(t) > k or e for t, e in zip(self.tokens, self.ended)) and any(len(t) > k for t in self.tokens)


def incomplete_rows(ordered: list[RequestOutput], max_new_tokens: int | None) -> list[str]:
    """What `generate` warns of (`IncompleteDocumentWarning`): rows whose constrained document will not parse."""
    messages = []
    cut = [i for i, o in enumerate(ordered) if o.finish_reason == "length_incomplete"]
    if cut:
        messages.append(f"hf_paged: row(s) {cut} of this generate reached max_new_tokens={max_new_tokens} before "
                        "their constrained document was complete, so their text will not parse; raise max_new_tokens "
                        "(or set SamplingParams.max_retries with generate_batch)")
    ended = [i for i, o in enumerate(ordered) if o.finish_reason == "stop_incomplete"]
    if ended:
        messages.append(f"hf_paged: row(s) {ended} of this generate ended (EOS) before their constrained document was "
                        "complete, so their text will not parse: the constraint refused a token that another logits "
                        "processor (bad_words_ids, suppress_tokens, sequence_bias, your own) left as the only choice, or "
                        "the tokenizer cannot spell what the constraint allows next; drop the conflicting processor")
    return messages
