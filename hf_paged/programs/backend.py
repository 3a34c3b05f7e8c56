"""The engine side of a program run: `Backend` (a wrapped model's engine and its tokenizer: encode, submit requests
to the engine loop, pin prefixes) and `RunContext` (one `run`: its requests in flight, its pins, aborting them).

Every call of every state submits its requests to the engine's loop (`EngineLoop.submit`), so the calls of all
running states (forks, `run_batch` instances) join the same continuous batch. Between calls a state pins its prefix
(`Engine.pin_prefix`): the blocks of its text stay in the prefix cache, so the next call prefills only its new text
(and the last partial block). A pin refused (`PrefixPinLimitError`: pins would hold more than
`PagedConfig.prefix_pin_share` of the pool) is skipped: the blocks then stay cached only until evicted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from hf_paged.batching.request import RequestOutput
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import PrefixPinLimitError
from hf_paged.programs.errors import ProgramAbortedError
from hf_paged.programs.track import Track

__all__ = ["Backend", "RunContext"]


class Backend:
    """A wrapped model's engine and its tokenizer (the model is wrapped with default settings when it is not)."""

    def __init__(self, model, tokenizer) -> None:
        from hf_paged.api.wrap_state import engine_of, is_wrapped

        if tokenizer is None or not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(f"a program needs the model's tokenizer, got {type(tokenizer).__name__}; pass "
                            "AutoTokenizer.from_pretrained(...) for the model")
        if not is_wrapped(model):
            from hf_paged.api.wrapping import wrap

            wrap(model)
        self.model = model
        self.tokenizer = tokenizer
        self.engine = engine_of(model)
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_token_id = eos
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else list(eos or ()))

    def encode(self, text: str, *, first: bool) -> list[int]:
        """Token ids of `text`; the first text of a state gets the tokenizer's special tokens (e.g. BOS)."""
        return list(self.tokenizer(text, add_special_tokens=first)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def submit(self, run: RunContext, prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
        """Run requests in the engine's continuous batch; their outputs in order. Aborted with the run."""
        run.check_open()
        submission = self.engine.loop.submit(prompts, params, stream=False)
        run.track(submission.all_ids)
        try:
            outputs = submission.result()
        finally:
            run.untrack(submission.all_ids)
        run.check_open()
        return [outputs[rid] for rid in submission.request_ids]

    def pin(self, track: Track) -> None:
        """Pin the track's computed prefix in the prefix cache, then drop its older pin."""
        old = track.pinned
        try:
            num_tokens = self.engine.pin_prefix(track.ids)
        except PrefixPinLimitError:
            num_tokens = 0
        track.pinned = list(track.ids[:num_tokens]) if num_tokens else None
        if old is not None:
            self.engine.unpin_prefix(old)

    def unpin(self, track: Track) -> None:
        if track.pinned is not None:
            self.engine.unpin_prefix(track.pinned)
            track.pinned = None


class RunContext:
    """One program run: the requests it has in flight, its tracks (whose pins it releases), an abort switch."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._tracks: list[Track] = []
        self.aborted = False
        self.finished = False  # the program returned: its states take no new calls

    def new_track(self, track: Track | None = None) -> Track:
        track = track if track is not None else Track()
        with self._lock:
            self._tracks.append(track)
        return track

    def track(self, request_ids: Sequence[str]) -> None:
        with self._lock:
            self._in_flight.update(request_ids)
            aborted = self.aborted
        if aborted:  # the run was aborted while these were being submitted
            self.backend.engine.loop.abort(*request_ids)

    def untrack(self, request_ids: Sequence[str]) -> None:
        with self._lock:
            self._in_flight.difference_update(request_ids)

    def check_open(self) -> None:
        if self.finished and not self.aborted:
            raise ProgramAbortedError("the program has returned: its states take no new calls; run it again")
        if self.aborted:
            raise ProgramAbortedError("the program was aborted (it raised, or another call failed); its requests "
                                      "were aborted and their blocks freed")

    def abort(self) -> None:
        """Abort every request in flight (their blocks go back to the pool before the next step)."""
        with self._lock:
            self.aborted = True
            ids = list(self._in_flight)
        if ids:
            self.backend.engine.loop.abort(*ids)

    def release(self) -> None:
        """Drop every pin of this run's tracks (the blocks stay cached, evictable)."""
        with self._lock:
            tracks, self._tracks = self._tracks, []
        for track in tracks:
            self.backend.unpin(track)
