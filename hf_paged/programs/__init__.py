"""Structured programs on the paged engine: `gen`, `select`, `fork` inside a Python function, and templates filled
field by field (`fill`), every call reusing the KV of the text before it.

    from hf_paged import programs as hp

    @hp.program
    def triage(s, ticket):
        s += "Ticket: " + ticket + "\\nIntent: " + hp.select("intent", ["billing", "complaint", "other"]) + "\\n"
        if s["intent"] == "complaint":
            s += "Apology: " + hp.gen("apology", max_tokens=24, stop="\\n")

    state = triage.run(model, tokenizer, ticket="my card was charged twice")
    filled = hp.fill(model, tokenizer, prompt, '{"intent": "[intent]", "reply": "[reply]"}',
                     intent=["billing", "other"], reply=hp.text(max_tokens=32))

Modules: `calls` (gen, select, expressions), `constraints` (text, regex, schema, grammar, choices), `state`
(ProgramState, forks), `program` (the decorator, run, run_batch), `template` + `fill` (templates), `steps` (one
call on a backend), `healing` (token healing), `one_shot` (a template as one generation), `backend` (what a program
needs from a backend: the protocol, its requests, a run's abort switch), `local` (in process: a wrapped model's
engine, pins), `http` (a running `hf-paged serve`: `hp.remote(url)`), `connect` (which backend a run gets), `track` (values), `errors`.

The same program runs against a server (`hf-paged serve`) over HTTP, with the same fields and token counts:

    state = triage.run(hp.remote("http://127.0.0.1:8000"), tokenizer, ticket="...")
"""

from __future__ import annotations

from hf_paged.programs.backend import ProgramBackend
from hf_paged.programs.calls import GenCall, SelectCall, gen, select
from hf_paged.programs.constraints import grammar, regex, schema, text
from hf_paged.programs.errors import (
    FieldConstraintError,
    ProgramAbortedError,
    ProgramError,
    ServerRequestError,
    ServerTimeoutError,
    ServerUnavailableError,
    TemplateError,
    ValidatorError,
)
from hf_paged.programs.fill import Filled, FilledField, fill
from hf_paged.programs.http import HTTPBackend, RemoteModel, remote
from hf_paged.programs.local import LocalBackend
from hf_paged.programs.program import Program, program
from hf_paged.programs.state import ForkGroup, ProgramState
from hf_paged.programs.track import Attempt, CallRecord, TokenCounts

__all__ = [
    "Attempt",
    "CallRecord",
    "FieldConstraintError",
    "Filled",
    "FilledField",
    "ForkGroup",
    "GenCall",
    "HTTPBackend",
    "LocalBackend",
    "Program",
    "ProgramAbortedError",
    "ProgramBackend",
    "ProgramError",
    "ProgramState",
    "RemoteModel",
    "SelectCall",
    "ServerRequestError",
    "ServerTimeoutError",
    "ServerUnavailableError",
    "TemplateError",
    "TokenCounts",
    "ValidatorError",
    "fill",
    "gen",
    "grammar",
    "program",
    "regex",
    "remote",
    "schema",
    "select",
    "text",
]
