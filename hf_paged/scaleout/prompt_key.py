"""The routing key of an OpenAI request: its prompt tokenized exactly as the replicas' `Preparer` tokenizes it.

The gateway only needs the token ids (to digest them); everything a request can get wrong is left to the replica,
which answers with the proper 400. When the prompt cannot be found here, the request is routed by load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from hf_paged.scaleout.summary import prompt_fingerprints
from hf_paged.serving.protocol import ChatCompletionRequest, CompletionRequest

__all__ = ["RoutingInfo", "prompt_ids", "routing_info", "template_shared_start"]

_DEFAULT_OUTPUT = 256  # output budget assumed for a chat request that sets no max_tokens


@dataclass(frozen=True, slots=True)
class RoutingInfo:
    """The `routing=` keyword of the gateway's handle call: the prompt as the router needs it (no Ray here)."""

    fingerprints: tuple[int, ...]  # `prompt_fingerprints` of the prompt (the replicas' block size and extra keys)
    num_prompt_tokens: int
    num_output_tokens: int  # max_tokens
    num_shared_tokens: int = 0  # the chat template's constant start (`template_shared_start`): no affinity


def prompt_ids(path: str, body: bytes, tokenizer: Any, max_chars: int | None = None
               ) -> tuple[list[int], int, int] | None:
    """(prompt token ids, output budget, n) of a completion or chat request, or None when there is none to find
    (or its text is longer than `max_chars`, more than any prompt the model takes: the replica refuses it from its
    length, and tokenizing megabytes here would hold up the gateway)."""
    try:
        data = json.loads(body)
        if path.endswith("/chat/completions"):
            request = ChatCompletionRequest.model_validate(data)
            if not getattr(tokenizer, "chat_template", None):
                return None
            messages = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in request.messages]
            if max_chars is not None and sum(len(m["content"]) for m in messages) > max_chars:
                return None
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # as Preparer.chat
            return list(ids), request.requested_max_tokens or _DEFAULT_OUTPUT, request.n
        if path.endswith("/completions"):
            request = CompletionRequest.model_validate(data)
            prompt = request.prompts()[0]  # several prompts: the first decides
            if isinstance(prompt, str) and max_chars is not None and len(prompt) > max_chars:
                return None
            ids = list(prompt) if isinstance(prompt, list) else tokenizer(prompt)["input_ids"]  # as Preparer
            return list(ids), request.max_tokens or 16, request.n
    except (ValueError, ValidationError, TypeError, KeyError, IndexError):
        return None
    except Exception:  # noqa: BLE001 -- a template error is the replica's to report, with its 400
        return None
    return None


# Pairs of conversations that differ from their first message's role on (the second pair, for templates that refuse
# a system role: only the content): what both prompts of a pair share is the template's, before any message
_PROBES = (
    ([{"role": "system", "content": "Alpha probe one."}, {"role": "user", "content": "Bravo question?"}],
     [{"role": "user", "content": "zulu 2"}]),
    ([{"role": "user", "content": "Alpha probe one."}], [{"role": "user", "content": "zulu 2"}]),
)


def template_shared_start(tokenizer: Any) -> int:
    """Tokens at the start of every chat prompt the tokenizer's chat template renders (a preamble such as a date
    header or a default policy): the common token prefix of two probe conversations that differ from their first
    message on, rendered as `prompt_ids` renders a chat. 0 when there is no template or it renders no probe pair."""
    if not getattr(tokenizer, "chat_template", None):
        return 0
    for pair in _PROBES:
        try:
            rendered = []
            for messages in pair:
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                rendered.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
            break
        except Exception:  # noqa: BLE001,S112 -- a template that rejects these probes (roles, ...): the next pair
            continue
    else:
        return 0  # no pair renders: assume no shared start
    first, second = rendered
    common = 0
    for a, b in zip(first, second):
        if a != b:
            break
        common += 1
    return common


def routing_info(path: str, body: bytes, tokenizer: Any, block_size: int, extra_keys: tuple = (),
                 shared_start: int = 0, max_model_len: int | None = None,
                 max_chars: int | None = None) -> RoutingInfo | None:
    """The `routing=` keyword for the handle call (None: route by load). `shared_start`: the chat template's
    constant start in tokens (`template_shared_start`), passed on for chat requests. The output counted is what the
    request can generate: its budget, at most the model's room after the prompt (`max_model_len`), times `n` (a
    `max_tokens` of 1e12, refused by the replica, weighed on its replica's share for as long as work decays)."""
    found = prompt_ids(path, body, tokenizer, max_chars)
    if found is None:
        return None
    ids, output, n = found
    if max_model_len is not None:
        output = min(output, max(max_model_len - len(ids), 1))
    shared = min(shared_start, len(ids)) if path.endswith("/chat/completions") else 0
    return RoutingInfo(tuple(prompt_fingerprints(ids, block_size, extra_keys)), len(ids), int(output) * n, shared)
