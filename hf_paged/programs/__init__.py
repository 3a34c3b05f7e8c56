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
call on the engine), `healing` (token healing), `one_shot` (a template as one generation), `backend` (engine,
tokenizer, pins), `track` (values), `errors`.
"""

from __future__ import annotations

from hf_paged.programs.calls import GenCall, SelectCall, gen, select
from hf_paged.programs.constraints import grammar, regex, schema, text
from hf_paged.programs.errors import (
    FieldConstraintError,
    ProgramAbortedError,
    ProgramError,
    TemplateError,
    ValidatorError,
)
from hf_paged.programs.fill import Filled, FilledField, fill
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
    "Program",
    "ProgramAbortedError",
    "ProgramError",
    "ProgramState",
    "SelectCall",
    "TemplateError",
    "TokenCounts",
    "ValidatorError",
    "fill",
    "gen",
    "grammar",
    "program",
    "regex",
    "schema",
    "select",
    "text",
]
