"""Which backend a program runs on, from what the caller passed where a model goes."""

from __future__ import annotations

from typing import Any

from hf_paged.programs.backend import ProgramBackend
from hf_paged.programs.http import HTTPBackend, RemoteModel
from hf_paged.programs.local import LocalBackend

__all__ = ["backend_for"]


def backend_for(model: Any, tokenizer: Any) -> ProgramBackend:
    """The backend a program runs on: a ready backend as it is, `hp.remote(url)` over HTTP, a model in process."""
    if isinstance(model, LocalBackend | HTTPBackend):  # made once, e.g. for many runs against one server
        if tokenizer is not None and tokenizer is not model.tokenizer:
            raise TypeError("a program backend brings its own tokenizer: pass tokenizer=None with it")
        return model
    if isinstance(model, RemoteModel):
        return HTTPBackend(model, tokenizer)
    return LocalBackend(model, tokenizer)
