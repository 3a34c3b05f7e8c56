"""OpenAI request bodies (completions and chat), as pydantic models that refuse what we cannot honour.

Fields follow OpenAI's API reference; `top_k`, `min_p`, `min_tokens`, `ignore_eos`, `repetition_penalty`,
`guided_json`, `guided_regex`, `guided_choice` and `guided_grammar` (Lark EBNF) are vLLM's extras;
`cache_retention_seconds` and `cache_retention_tokens` are ours (a prompt prefix kept cached, `retention.py`).
`return_token_ids` is vLLM's (each choice gets `prompt_token_ids` and `token_ids`; ours adds `finish_detail`, the
engine's own finish reason). Completions take OpenAI's scoring form `echo: true, logprobs: N, max_tokens: 0` (the
prompt's log-probabilities, `serving/echo.py`), with our `prompt_logprobs_start` (the first prompt position scored),
and `echo: true` with `max_tokens >= 1` (the prompt, then the generated text). Generated tokens' log-probabilities:
completions' `logprobs: N`, chat's `logprobs: true` + `top_logprobs: N` (N in 0..20; `serving/logprobs.py`). An
unknown field is refused (as OpenAI does: a typo such as `max_token` must not be ignored silently); fields we know
but cannot honour are refused when set to anything but their neutral value, with the field named (`param`) in the
400 answer.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hf_paged.batching.logprobs import MAX_LOGPROBS

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "ResponseFormat",
    "TokenizeRequest",
    "UnsupportedField",
]



def _finite(value: Any) -> Any:
    """NaN and infinities (JSON's NaN/Infinity extensions) named as such before a bound is checked (pydantic read
    `temperature: NaN` as "Input should be greater than or equal to 0")."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PydanticCustomError("finite_number", "Input should be a finite number")
    return value


Number = Annotated[StrictInt | StrictFloat, BeforeValidator(_finite)]


# Lists stop at their first bad item (pydantic's `fail_fast`): collecting one error per item made a 5 MB `stop` of
# 2M integers cost 17 s of validation, a 9 MB chat `content` of 2M strings 25 s and 3.8 GB, before their 400 (h80).
_Strs = Annotated[list[StrictStr], Field(fail_fast=True)]
_Ids = Annotated[list[StrictInt], Field(fail_fast=True)]
_IdLists = Annotated[list[_Ids], Field(fail_fast=True)]


def _prompt_form(value: Any) -> str | None:
    """Which form a completions `prompt` takes, from its type and its first item's. A plain union tried every form
    on every item: a 31 MB list of token ids cost 1.4 GB and 3 s of validation (one error per id per form) before
    its 400, so a few such bodies at once took the server's memory (h80)."""
    if isinstance(value, str):
        return "text"
    if not isinstance(value, list):
        return None
    first = value[0] if value else None
    return "texts" if isinstance(first, str) else "id_lists" if isinstance(first, list) else "ids"


Prompt = Annotated[
    Annotated[StrictStr, Tag("text")] | Annotated[_Strs, Tag("texts")]
    | Annotated[_Ids, Tag("ids")] | Annotated[_IdLists, Tag("id_lists")],
    Discriminator(_prompt_form, custom_error_type="prompt_type",
                  custom_error_message="Input should be a string, a list of strings, a list of token ids (integers) "
                                       "or a list of lists of token ids"),
]


class UnsupportedField(ValueError):
    """A known OpenAI field set to a value this server does not implement."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _count(value: Any, name: str) -> Any:
    """`logprobs` (completions) / `top_logprobs` (chat): None or an int in 0..MAX_LOGPROBS (a 400 naming it)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value <= MAX_LOGPROBS):
        raise ValueError(f"{name} must be an integer from 0 to {MAX_LOGPROBS} (the most likely tokens returned at "
                         f"each position), got {value!r}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JSONSchemaFormat(_Strict):
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | bool = Field(alias="schema")
    strict: StrictBool | None = None


class NumberDigitsField(_Strict):
    """`guided_number_digits`: most digits of a JSON constraint's numbers (`hf_paged.processors.NumberDigits`)."""

    integer: Annotated[StrictInt, Field(ge=1)] | None = None
    fraction: Annotated[StrictInt, Field(ge=1)] | None = None
    exponent: Annotated[StrictInt, Field(ge=1)] | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format of type "json_schema" needs a "json_schema": {"schema": {...}} object')
        if self.type != "json_schema" and self.json_schema is not None:  # (ignored, the answer would not follow it)
            raise ValueError(f'a "json_schema" is followed with response_format type "json_schema", not '
                             f'"{self.type}": send {{"type": "json_schema", "json_schema": ...}}')
        return self


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _Sampling(_Strict):
    """Fields shared by completions and chat completions."""

    model: StrictStr | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[Number, Field(ge=0, allow_inf_nan=False)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), lt=2**63)] | None = None
    stop: StrictStr | _Strs | None = None
    response_format: ResponseFormat | None = None
    user: StrictStr | None = None
    # accepted and ignored: they do not change the output
    store: StrictBool | None = None
    metadata: dict[str, StrictStr] | None = None
    service_tier: StrictStr | None = None
    # log-probabilities: completions' `logprobs: N`; chat's `logprobs: true` + `top_logprobs: N` (checked per kind)
    logprobs: Any = None
    top_logprobs: Any = None
    # OpenAI's penalties over the generated tokens and bias per token id (`batching/penalties.py`)
    logit_bias: dict[StrictStr, Annotated[Number, Field(ge=-100, le=100)]] | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    # vLLM extras
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    ignore_eos: StrictBool = False
    repetition_penalty: Annotated[Number, Field(gt=0, allow_inf_nan=False)] | None = None
    guided_json: dict[str, Any] | bool | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: _Strs | None = None
    guided_grammar: StrictStr | None = None  # a context-free grammar in Lark's EBNF (`GrammarLogitsProcessor`)
    # the whitespace a JSON constraint allows between tokens (a regex; default at most one space, bounded)
    guided_whitespace_pattern: StrictStr | None = None
    # hf_paged: most digits of a JSON constraint's numbers' integer part, fraction and exponent (each >= 1; a part
    # left out keeps the default's bound: integer none, fraction 23, exponent 3)
    guided_number_digits: NumberDigitsField | None = None
    # hf_paged: keep this prompt's prefix cached (pinned) for this long after its prompt is computed
    # (`serving/retention.py`), its first `cache_retention_tokens` tokens (default: the whole prompt)
    cache_retention_seconds: Annotated[Number, Field(gt=0, allow_inf_nan=False)] | None = None
    cache_retention_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    # vLLM: each choice carries `prompt_token_ids` and `token_ids` (generated, as the engine produced them)
    return_token_ids: StrictBool = False

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys_are_token_ids(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in value or ():
            if not key.isascii() or not key.isdigit() or len(key) > 20:  # (int() of 4,300 digits raises)
                raise ValueError(f"logit_bias keys must be token ids as decimal strings (such as \"50256\"), got "
                                 f"{key[:40]!r}")
        return value

    def token_bias(self, vocab_size: int) -> dict[int, float] | None:
        """`logit_bias` as the engine's `{token id: bias}` (None when not given or empty).

        Raises:
            UnsupportedField: an id outside the model's vocabulary `[0, vocab_size)`."""
        bias = {int(key): float(bias) for key, bias in self.logit_bias.items()} if self.logit_bias else None
        outside = sorted(t for t in bias or () if t >= vocab_size)
        if outside:
            raise UnsupportedField("logit_bias", f"logit_bias names token ids {outside[:5]} outside this model's "
                                   f"vocabulary [0, {vocab_size}); bias its own token ids")
        return bias

    def check_supported(self) -> None:
        """Raise `UnsupportedField` for the first field we know but cannot honour."""
        guides = [name for name in _GUIDES if getattr(self, name) is not None
                  and not (name == "response_format" and self.response_format.type == "text")]
        if len(guides) > 1:
            raise UnsupportedField(guides[1], f"give one output constraint, not {' and '.join(guides)}")
        if self.stream_options is not None and not self.stream:
            raise UnsupportedField("stream_options", "stream_options applies to streamed answers only; leave it out "
                                   "or send stream: true")
        if self.stop is not None and any(s == "" for s in ([self.stop] if isinstance(self.stop, str) else self.stop)):
            raise UnsupportedField("stop", "stop sequences must be non-empty strings")


_GUIDES = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


class CompletionRequest(_Sampling):
    prompt: Prompt
    max_tokens: StrictInt | None = 16  # OpenAI's default for completions
    echo: StrictBool = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = None
    # hf_paged, with echo: the first prompt position that gets a log-probability (default 1: all but the first
    # token, as OpenAI's echo); the positions before it may come from the prefix cache
    prompt_logprobs_start: Annotated[StrictInt, Field(ge=1)] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None:
            raise UnsupportedField("top_logprobs", "top_logprobs is a chat field; completions take logprobs: N (the "
                                   "N most likely tokens at each position)")
        if self.echo and self.max_tokens == 0:
            self._check_echo()
        if self.prompt_logprobs_start is not None and not (self.echo and self.max_tokens == 0):
            raise UnsupportedField("prompt_logprobs_start", "prompt_logprobs_start applies to scoring (echo: true, "
                                   "logprobs: 0, max_tokens: 0); leave it out or add those")
        if self.suffix:
            raise UnsupportedField("suffix", "suffix (insertion) is not supported by hf-paged serve; leave it out")
        if self.best_of not in (None, self.n):
            raise UnsupportedField("best_of", "best_of is not supported by hf-paged serve; use n")

    def _check_echo(self) -> None:
        """echo with max_tokens: 0 is scoring: the prompt's tokens' log-probabilities, nothing generated."""
        scoring = "send echo: true with logprobs: N and max_tokens: 0 to score a prompt"
        if self.logprobs is None:
            raise UnsupportedField("logprobs", f"echo with max_tokens: 0 needs logprobs: 0 (the prompt tokens' own "
                                   f"log-probabilities) or logprobs: N (and the N most likely tokens); {scoring}")
        for name, bad in (("n", self.n != 1), ("stream", self.stream), ("stop", self.stop is not None),
                          ("cache_retention_seconds", self.cache_retention_seconds is not None),
                          ("min_tokens", self.min_tokens != 0), ("ignore_eos", self.ignore_eos)):
            if bad:
                raise UnsupportedField(name, f"{name} does not apply to echo scoring (nothing is generated); "
                                       "leave it out")
        for name in _GUIDES:
            if getattr(self, name) is not None and not (name == "response_format" and self.response_format.type
                                                        == "text"):
                raise UnsupportedField(name, f"{name} does not apply to echo scoring (nothing is generated); "
                                       "leave it out")

    @property
    def num_logprobs(self) -> int | None:
        """The engine's `SamplingParams.logprobs`: None (off) or the alternatives asked per token."""
        return self.logprobs

    @field_validator("logprobs")
    @classmethod
    def _logprobs_in_range(cls, value: Any) -> Any:
        return _count(value, "logprobs")

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            return [[]]  # an empty prompt: refused later with the engine's own message
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # tool_calls, refusal, ... pass through to the chat template

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Annotated[list[TextPart], Field(fail_fast=True)] | None = Field(None, validate_default=True)
    name: StrictStr | None = None

    @field_validator("content")
    @classmethod
    def _content_given(cls, value: Any, info: Any) -> Any:
        # OpenAI's rule: only an assistant turn may have no content (its tool_calls or refusal say what it did); a
        # null user or system content is a client's bug, which read as "" would answer a question nobody asked
        if value is None and info.data.get("role", "assistant") != "assistant":
            raise PydanticCustomError("content_missing", "a {role} message needs content (a string or a list of text "
                                      "parts), got null", {"role": info.data["role"]})
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1, fail_fast=True)]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    tools: Annotated[list[dict[str, Any]], Field(fail_fast=True)] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:  # (0 asks for nothing: accepted, as before)
            raise UnsupportedField("top_logprobs", "top_logprobs needs logprobs: true (each generated token's "
                                   "log-probability); add it, or leave top_logprobs out")
        if self.tools or self.tool_choice not in (None, "none"):
            raise UnsupportedField("tools", "tool calling is not supported by hf-paged serve; leave tools out")

    @field_validator("logprobs")
    @classmethod
    def _logprobs_is_a_flag(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"chat's logprobs is a boolean (true: each generated token's log-probability), got "
                             f"{value!r}; ask for alternatives with top_logprobs: N")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_in_range(cls, value: Any) -> Any:
        return _count(value, "top_logprobs")

    @property
    def num_logprobs(self) -> int | None:
        """The engine's `SamplingParams.logprobs`: None (off) or the alternatives asked per token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Strict):
    """vLLM's `/tokenize`: a text's token ids (a client that tokenizes itself checks it has the server's tokenizer)."""

    model: StrictStr | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True

    def check_supported(self) -> None:
        return None
