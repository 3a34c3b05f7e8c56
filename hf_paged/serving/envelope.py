"""The OpenAI response envelope: `Head` (one response's id, kind and model) makes its choices and its body."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from hf_paged.serving.generation import ChoiceEvent
from hf_paged.serving.logprobs import TokenPieces, chat_logprobs, completion_logprobs

__all__ = ["Head"]


@dataclass(slots=True)
class Head:
    kind: str  # "text_completion" | "chat.completion"
    model: str
    token_ids: bool = False  # return_token_ids: each choice carries its prompt's and its own token ids
    pieces: TokenPieces | None = None  # token texts and bytes, for the choices' `logprobs` (None: not asked)
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.kind.startswith("chat") else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def envelope(self, choices: list[dict], usage: dict | None = None, chunk: bool = False) -> dict:
        kind = f"{self.kind}.chunk" if chunk and self.kind.startswith("chat") else self.kind
        out = {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    def choice(self, event: ChoiceEvent, chunk: bool, first: bool = False) -> dict:
        finish = event.finish_reason if event.finish_reason != "error" else None
        chat = self.kind.startswith("chat")
        logprobs = None
        if event.logprobs is not None and self.pieces is not None:  # streamed: this chunk's tokens' entries
            logprobs = (chat_logprobs(event.logprobs, self.pieces) if chat
                        else completion_logprobs(event.logprobs, self.pieces))
        if not chat:
            out = {"index": event.index, "text": event.text, "logprobs": logprobs, "finish_reason": finish}
        elif chunk:
            delta = {"role": "assistant", "content": event.text} if first else {"content": event.text}
            out = {"index": event.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            out = {"index": event.index, "message": {"role": "assistant", "content": event.text},
                   "logprobs": logprobs, "finish_reason": finish}
        if self.token_ids:  # vLLM's return_token_ids (streamed: each chunk's own tokens, the prompt at the end)
            out["token_ids"] = list(event.token_ids or [])
            if event.finish_reason is not None:
                out.update(prompt_token_ids=event.prompt_token_ids, finish_detail=event.finish_detail)
        return out

