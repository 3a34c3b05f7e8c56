"""What a program needs from whatever runs its model: the `ProgramBackend` protocol, the requests it sends
(`GenRequest`, scoring prompts) and what comes back (`Generated`, `Scored`), and `RunContext` (one `run`: its
requests in flight, its tracks' pins, aborting them).

Two backends implement it; the program layer (`steps`, `state`, `fill`, `one_shot`) never knows which:

    LocalBackend (local.py)    a wrapped model's engine in this process: requests join its continuous batch,
                               a state's prefix stays pinned between calls
    HTTPBackend  (http.py)     a running `hf-paged serve`: completions with token-id prompts, `guided_*` fields,
                               `return_token_ids`, scoring by `echo` (the server's prefix cache gives the reuse)

    connect.backend_for(model, tokenizer)   a wrapped or plain model -> LocalBackend; hp.remote(url) -> HTTPBackend

A call's constraint travels as a `Guide` (regex text, a JSON schema or a Lark grammar), not as a processor object:
the in-process backend builds the processor, the server builds the same one from its `guided_*` field.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from hf_paged.after_fork import call_after_fork
from hf_paged.batching.stopping import per_tokenizer
from hf_paged.programs.errors import ProgramAbortedError
from hf_paged.programs.track import Track

__all__ = ["GenRequest", "Generated", "Guide", "ProgramBackend", "RunContext", "Scored", "continuation_ids",
           "continuation_texts", "guide_processor"]


@dataclass(frozen=True, slots=True)
class Guide:
    """A generation's output constraint: regex text (Rust syntax), a JSON schema, or a Lark grammar."""

    kind: Literal["regex", "json_schema", "grammar"]
    spec: Any
    start: str = "start"  # a grammar's start rule


def guide_processor(guide: Guide, tokenizer: Any, eos_token_id: Any = None):
    """The logits processor that enforces `guide` (its compiled index comes from the process-wide cache)."""
    from hf_paged.processors import GrammarLogitsProcessor, JSONSchemaLogitsProcessor, RegexLogitsProcessor

    if guide.kind == "regex":
        return RegexLogitsProcessor(guide.spec, tokenizer, eos_token_id=eos_token_id)
    if guide.kind == "json_schema":
        return JSONSchemaLogitsProcessor(guide.spec, tokenizer, eos_token_id=eos_token_id)
    return GrammarLogitsProcessor(guide.spec, tokenizer, start=guide.start, eos_token_id=eos_token_id)


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One generation: the prompt's token ids and how to sample after it."""

    what: str  # the call, for error messages ("hp.gen('intent')")
    prompt: list[int]
    max_tokens: int
    sampled: bool  # False: greedy
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...] = ()
    guide: Guide | None = None
    healing: Any = None  # a `healing.TokenHealing` (in process only): the first token must extend its `lead`


@dataclass(frozen=True, slots=True)
class Generated:
    """A finished generation: the tokens as the engine produced them (EOS and stop-string tokens included)."""

    token_ids: list[int]
    finish_reason: str  # the engine's: "stop", "length", "length_incomplete" (a constraint cut short)
    num_prompt_tokens: int  # prompt tokens of the engine request
    num_cached_tokens: int  # of which served from the prefix cache


@dataclass(frozen=True, slots=True)
class Scored:
    """Scored prompts: per prompt, the log-probability of each token from the scored position on."""

    logprobs: list[list[float]]
    num_prompt_tokens: int  # prompt tokens of the engine requests (each prompt less its last token), summed
    num_cached_tokens: int  # of which served from the prefix cache


class ProgramBackend(Protocol):
    """What runs a program's calls. `generate` and `score` block the calling thread (a state's worker) while the
    requests run among everyone else's; both raise `ProgramAbortedError` once the run is aborted."""

    tokenizer: Any
    eos_ids: frozenset[int]  # tokens that end a generation (stripped from a field's tokens)
    supports_healing: bool  # token healing needs a processor object: in process only

    @property
    def block_size(self) -> int: ...

    def encode(self, text: str, *, first: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text `ids` add after earlier text, special tokens spelled out (`continuation_texts`)."""
        ...

    def generate(self, run: RunContext, request: GenRequest) -> Generated: ...

    def score(self, run: RunContext, what: str, prompts: list[list[int]], start: int) -> Scored:
        """Log-probabilities of `prompt[start:]` given what precedes each position, for every prompt."""
        ...

    def accepts(self, guide: Guide, token_ids: Sequence[int]) -> bool:
        """Whether `token_ids` (an output from its first token) are a whole document of `guide`: the processor's
        automaton ends in an accepting state. Asked of an output cut back to its field's budget."""
        ...

    def pin(self, track: Track) -> None:
        """Keep the track's computed prefix cached for its next call (set `track.pinned`)."""
        ...

    def unpin(self, track: Track) -> None: ...


_ANCHORS: weakref.WeakKeyDictionary[Any, tuple[list[int], str]] = weakref.WeakKeyDictionary()
_NEWLINES: weakref.WeakKeyDictionary[Any, list[int] | None] = weakref.WeakKeyDictionary()


def continuation_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` written after earlier text (`encode` for programs: text between two calls, a choice).
    A SentencePiece tokenizer that prepends "▁" to whatever it encodes (Llama 2's `Prepend` normalizer) would give
    "b" a space the text does not have ("▁b"): for such a tokenizer the text is encoded after a newline and the
    newline's ids are cut off. Other tokenizers encode the text as it is."""
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    newline = _newline_ids(tokenizer)
    if newline is None:
        return plain
    ids = list(tokenizer("\n" + text, add_special_tokens=False)["input_ids"])
    return ids[len(newline):] if ids[: len(newline)] == newline else plain


def _newline_ids(tokenizer: Any) -> list[int] | None:
    """The ids of "\n" when the tokenizer prepends a space to what it encodes ("a" reads " a" after other text),
    else None; once per tokenizer."""
    return per_tokenizer(_NEWLINES, tokenizer, _find_newline_ids)


def _find_newline_ids(tokenizer: Any) -> list[int] | None:
    prepends = continuation_texts(tokenizer, [tokenizer("a", add_special_tokens=False)["input_ids"]])[0] != "a"
    return list(tokenizer("\n", add_special_tokens=False)["input_ids"]) if prepends else None


def continuation_texts(tokenizer: Any, pieces: Sequence[Sequence[int]]) -> list[str]:
    """The text each token-id list adds after earlier text (`decode` for programs: a field's tokens, a token given
    back by healing). Decoded behind an anchor token and the anchor's text cut off, because some decoders change
    what they decode first: a Llama-2-style SentencePiece decoder (`Strip`) drops its leading space, so "▁billing"
    alone reads "billing" where the text it continues reads " billing"."""
    anchor = _anchor(tokenizer)
    if anchor is None:
        return [tokenizer.decode(list(ids), skip_special_tokens=False) for ids in pieces]
    anchor_ids, anchor_text = anchor
    texts = tokenizer.batch_decode([anchor_ids + list(ids) for ids in pieces], skip_special_tokens=False)
    return [text[len(anchor_text):] if text.startswith(anchor_text)
            else tokenizer.decode(list(ids), skip_special_tokens=False) for text, ids in zip(texts, pieces)]


def _anchor(tokenizer: Any) -> tuple[list[int], str] | None:
    """Ids of a plain letter and their decoded text, once per tokenizer (None: the tokenizer cannot give one)."""
    return per_tokenizer(_ANCHORS, tokenizer, _find_anchor)


def _find_anchor(tokenizer: Any) -> tuple[list[int], str] | None:
    ids = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return (ids, text) if ids and text else None


_RUNS: weakref.WeakSet[RunContext] = weakref.WeakSet()  # every run of this process (`_after_fork_in_child`)
call_after_fork(_RUNS, "_after_fork_in_child")


class RunContext:
    """One program run: the requests it has in flight (each with its way to cancel), its tracks (whose pins it
    releases), an abort switch."""

    def __init__(self, backend: ProgramBackend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._in_flight: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._tracks: list[Track] = []
        self.aborted = False
        self.finished = False  # the program returned: its states take no new calls
        # notified whenever one of the run's states goes idle or fails (`ProgramState.join` waits on it, so the first
        # error of any fork is seen at once, not after the forks before it in order have finished)
        self.settled = threading.Condition()
        _RUNS.add(self)

    def _after_fork_in_child(self) -> None:
        """Fresh locks in a forked child (a thread of the parent may have held them)."""
        self._lock = threading.Lock()
        self.settled = threading.Condition()

    def new_track(self, track: Track | None = None) -> Track:
        track = track if track is not None else Track()
        with self._lock:
            self._tracks.append(track)
        return track

    def track(self, cancel: Callable[[], None]) -> int:
        """Register work in flight; `cancel()` ends it (called at once if the run was aborted meanwhile)."""
        with self._lock:
            self._next += 1
            self._in_flight[self._next] = cancel
            handle, aborted = self._next, self.aborted
        if aborted:  # the run was aborted while this was being submitted
            cancel()
        return handle

    def untrack(self, handle: int) -> None:
        with self._lock:
            self._in_flight.pop(handle, None)

    def check_open(self) -> None:
        if self.finished and not self.aborted:
            raise ProgramAbortedError("the program has returned: its states take no new calls; run it again")
        if self.aborted:
            raise ProgramAbortedError("the program was aborted (it raised, or another call failed); its requests "
                                      "were aborted and their blocks freed")

    def abort(self) -> None:
        """Cancel everything in flight (in process: aborted before the next step; over HTTP: the connection is
        closed, and the server aborts the request)."""
        with self._lock:
            self.aborted = True
            cancels = list(self._in_flight.values())
        for cancel in cancels:
            cancel()

    def release(self) -> None:
        """Drop every pin of this run's tracks (the blocks stay cached, evictable)."""
        with self._lock:
            tracks, self._tracks = self._tracks, []
        for track in tracks:
            self.backend.unpin(track)
