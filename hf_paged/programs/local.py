"""The in-process backend: a wrapped model's engine and its tokenizer (`LocalBackend`).

Every call of every state submits its requests to the engine's loop (`EngineLoop.submit`), so the calls of all
running states (forks, `run_batch` instances) join the same continuous batch. Between calls a state pins its prefix
(`Engine.pin_prefix`): the blocks of its text stay in the prefix cache, so the next call prefills only its new text
(and the last partial block). A pin refused (`PrefixPinLimitError`: pins would hold more than
`PagedConfig.prefix_pin_share` of the pool) is skipped: the blocks then stay cached only until evicted. Without the
prefix cache (`enable_prefix_caching=False`) nothing is pinned and each call prefills its whole prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from hf_paged.batching.request import RequestOutput, RequestStatus
from hf_paged.batching.sampling import SamplingParams
from hf_paged.errors import HfPagedError, PrefixPinLimitError
from hf_paged.programs.backend import (
    Generated,
    GenRequest,
    Guide,
    RunContext,
    Scored,
    continuation_ids,
    continuation_texts,
    guide_processor,
)
from hf_paged.programs.errors import ProgramError
from hf_paged.programs.track import Track

__all__ = ["LocalBackend"]


class LocalBackend:
    """A wrapped model's engine and its tokenizer (the model is wrapped with default settings when it is not)."""

    supports_healing = True

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

    @property
    def block_size(self) -> int:
        return self.engine.config.block_size

    def encode(self, text: str, *, first: bool) -> list[int]:
        """Token ids of `text`; the first text of a state gets the tokenizer's special tokens (e.g. BOS)."""
        if first:
            return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        return continuation_ids(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        """The text `ids` add after what precedes them (`continuation_texts`)."""
        return continuation_texts(self.tokenizer, [ids])[0]

    def generate(self, run: RunContext, request: GenRequest) -> Generated:
        processors = [self._processor(request.guide)] if request.guide is not None else \
            [request.healing.processor] if request.healing is not None else []
        params = SamplingParams(
            max_new_tokens=request.max_tokens, do_sample=request.sampled, temperature=request.temperature,
            top_p=request.top_p, seed=request.seed, eos_token_id=self.eos_token_id,
            stop_strings=list(request.stop) or None, tokenizer=self.tokenizer if request.stop else None,
            logits_processors=processors,
        )
        (output,) = self._submit(run, [request.prompt], [params])
        _check(request.what, output)
        return Generated(list(output.generated_tokens), output.finish_reason or "length", len(request.prompt),
                         output.num_cached_tokens)

    def score(self, run: RunContext, what: str, prompts: list[list[int]], start: int) -> Scored:
        params = [SamplingParams(max_new_tokens=1, score_targets=p[start:]) for p in prompts]
        outputs = self._submit(run, [p[:-1] for p in prompts], params)
        for output in outputs:
            _check(what, output)
        return Scored([list(o.score_logprobs or []) for o in outputs], sum(len(o.prompt_ids) for o in outputs),
                      sum(o.num_cached_tokens for o in outputs))

    def _submit(self, run: RunContext, prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
        """Run requests in the engine's continuous batch; their outputs in order. Aborted with the run."""
        run.check_open()
        submission = self.engine.loop.submit(prompts, params, stream=False)
        handle = run.track(submission.cancel)  # (before it runs too: then nothing of it runs)
        try:
            outputs = submission.result()
        finally:
            run.untrack(handle)
        run.check_open()
        return [outputs[rid] for rid in submission.request_ids]

    def pin(self, track: Track) -> None:
        """Pin the track's computed prefix in the prefix cache, then drop its older pin."""
        if not self.engine.config.enable_prefix_caching:  # no cache to pin in: the program runs without reuse
            return
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

    def _processor(self, guide: Guide):
        return guide_processor(guide, self.tokenizer, self.eos_token_id)

    def accepts(self, guide: Guide, token_ids: Sequence[int]) -> bool:
        """Whether `token_ids` are a whole document of `guide` (its processor's accepting state)."""
        return self._processor(guide).accepts(token_ids)


def _check(what: str, output: RequestOutput) -> None:
    """Raise the typed error of a request that did not finish."""
    if output.status is RequestStatus.FINISHED:
        return
    error_type = output.error_type
    if isinstance(error_type, type) and issubclass(error_type, HfPagedError):
        raise error_type(f"{what}: {output.error}")
    raise ProgramError(f"{what}: its request ended {output.finish_reason or 'failed'}: {output.error}")
