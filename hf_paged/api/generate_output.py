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


def make_streamer_hook(streamer, input_ids: torch.Tensor, order: list[str], pad_token_id: int,
                       assisted: bool = False) -> Callable | None:
    """Feed `streamer` like stock generate: the prompt first, then one `[rows]` tensor of new tokens per step;
    `assisted` (one row, as stock's assisted decoding takes): one `[1, k]` tensor of the tokens a step accepted."""
    if streamer is None:
        return None
    streamer.put(input_ids.cpu())

    def on_step(step) -> None:
        new = [step.new_tokens.get(rid, []) for rid in order]
        if assisted:
            if new[0]:
                streamer.put(torch.tensor([new[0]]))
            return
        for j in range(max((len(n) for n in new), default=0)):
            streamer.put(torch.tensor([n[j] if j < len(n) else pad_token_id for n in new]))

    return on_step


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
