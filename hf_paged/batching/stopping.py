"""Stop conditions of a request after a token is appended."""

from __future__ import annotations

from hf_paged.batching.request import Request


def check_stop(request: Request, max_model_len: int) -> str | None:
    """"stop" (EOS id or stop string), "length" (max_new_tokens or the model's maximum length), or None."""
    params = request.params
    last = request.output_ids[-1]
    if last in params.eos_token_ids and len(request.output_ids) >= params.min_new_tokens:
        return "stop"
    if params.stop_strings and _ends_with_stop_string(request):
        return "stop"
    if len(request.output_ids) >= params.max_new_tokens or request.num_tokens >= max_model_len:
        return "length"
    return None


def _ends_with_stop_string(request: Request) -> bool:
    stops = request.params.stop_strings
    # A stop string of k characters spans at most k tokens (every token decodes to >= 1 character, or to part of
    # a multi-byte character: 4 bytes each at most); decode only that tail, not the whole output.
    window = 4 * max(len(s) for s in stops) + 1
    tail = request.params.tokenizer.decode(request.output_ids[-window:], skip_special_tokens=False)
    return any(s in tail for s in stops)
