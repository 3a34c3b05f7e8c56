"""Fetch or recompute: a load starts only when moving the blocks' bytes costs less than computing their tokens.

    fetch cost      = bytes / bandwidth        bandwidth: bytes/s of this connector's own loads (read, check, write
                                               into the pool), decayed
    recompute cost  = tokens / prefill speed   prefill speed: tokens/s of this engine's own prefill steps, decayed

Both rates are decayed sums of work over seconds (`Rate`): each observation adds its work units (bytes, tokens) and
its seconds, and the older sums shrink by `decay`, so the estimate follows the machine (a cold disk, a busy device)
while one noisy step moves it little. Each starts from a prior worth `prior_weight` seconds of observations, chosen
so that loading wins until measured (1 GB/s against 1,000 tokens/s: a block must hold over 1 MB per token to lose),
the behaviour before the model existed; the measurements then take over. A decision against loading is revisited
every `explore_every`-th time (a load is tried anyway and measured), so a disk that got faster is noticed.

The same two rates bound a step's load work (`paced_load.py`): `block_tokens(nbytes)` is what writing one block on
the step's thread (`step_load`: bytes/s of that part alone, reads in a worker thread not counted) costs in prompt
tokens of this engine's forward (one more token's cost, `MarginalCost`), so a step's share of block writes is a share
of its token budget, never seconds.

The comparison is in work units: only the two rates come from clocks, and `learn=False` freezes them (tests inject
their measurements with `observe_*` and get the same decisions every run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hf_paged.kv_transfer.step_times import StepTimes

__all__ = ["CostEstimate", "Rate", "StepClock", "StepSample", "StepTimes", "TransferCostModel", "work_clock"]


def work_clock(device: torch.device):
    """The clock that times a step's work for `device`: on a CPU the stepping thread's own CPU time (the forward runs
    there, its intra-op threads joined at each op: other processes on a loaded machine do not stretch it, where the
    wall clock measured a 30-40 ms decode step as 100-150 ms under a load average of 6 on 2 cores), else the wall
    clock (device work is timed by events, `StepClock`)."""
    return time.thread_time if device.type == "cpu" else time.perf_counter


class Rate:
    """A decayed rate: work units per second over the observations, the newest counting most."""

    def __init__(self, prior_per_second: float, prior_weight: float, decay: float) -> None:
        if not prior_per_second > 0 or not prior_weight > 0:
            raise ValueError(f"a rate's prior must be > 0, got {prior_per_second!r} per second over {prior_weight!r} s")
        self.decay = decay
        self.work, self.seconds = prior_per_second * prior_weight, prior_weight
        self.num_observations = 0

    def observe(self, work: float, seconds: float) -> None:
        if work <= 0 or seconds <= 0:
            return
        self.work = self.work * self.decay + work
        self.seconds = self.seconds * self.decay + seconds
        self.num_observations += 1

    @property
    def per_second(self) -> float:
        return self.work / self.seconds


class MarginalCost:
    """The cost of one more token in a step: the slope of a decayed least-squares line through (tokens, seconds) of
    the timed steps. A step's forward has a fixed part (the weights read once) that a small step's average per token
    carries in full: on the CPU a 16-token chunk beside decodes measured ~2.2 ms a token on average, ~0.7 marginal.
    None until the steps' sizes spread (their standard deviation at least half their mean: steps of 16-22 tokens
    that differ in how many decodes they carry gave slopes of 1-8 ms a token, noise)."""

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self.w = self.n = self.t = self.nn = self.nt = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds <= 0:
            return
        d = self.decay
        self.w, self.n, self.t = self.w * d + 1, self.n * d + num_tokens, self.t * d + seconds
        self.nn, self.nt = self.nn * d + num_tokens * num_tokens, self.nt * d + num_tokens * seconds

    @property
    def seconds_per_token(self) -> float | None:
        spread = self.w * self.nn - self.n * self.n  # w^2 * variance of the sizes
        if self.w < 2 or 4 * spread < self.n * self.n:  # variance < (mean / 2)^2
            return None
        slope = (self.w * self.nt - self.n * self.t) / spread
        return slope if slope > 0 else None


@dataclass(frozen=True, slots=True)
class CostEstimate:
    fetch_seconds: float  # bytes / bandwidth
    recompute_seconds: float  # tokens / prefill speed

    @property
    def load_is_cheaper(self) -> bool:
        return self.fetch_seconds < self.recompute_seconds


class TransferCostModel:
    """Decides whether a load is worth starting.

    Args:
        bandwidth_prior: bytes/s assumed before any load was measured.
        prefill_prior: tokens/s assumed before any prefill step was measured.
        prior_weight: seconds of observations the priors count as (smaller: measurements take over sooner).
        decay: how much of the older sums each observation keeps (0 < decay <= 1).
        explore_every: after this many decisions against loading in a row, one load is tried anyway (0: never).
        learn: False freezes the rates (`observe_*` still update them: tests inject measurements that way).
    """

    def __init__(self, *, bandwidth_prior: float = 1e9, prefill_prior: float = 1e3, prior_weight: float = 0.05,
                 decay: float = 0.9, explore_every: int = 16, learn: bool = True) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, int) or explore_every < 0:
            raise ValueError(f"explore_every must be an int >= 0, got {explore_every!r}")
        self.bandwidth = Rate(bandwidth_prior, prior_weight, decay)
        self.prefill = Rate(prefill_prior, prior_weight, decay)
        self.prefill_prior_seconds = 1 / prefill_prior  # a token's cost until measured
        self.step_load = Rate(bandwidth_prior, prior_weight, decay)  # the step thread's part of loads only
        self.marginal = MarginalCost()  # one more prompt token's cost in a prefill step (until `steps` measures it)
        self.steps = StepTimes()  # a decode-only step and what a prompt token adds beside decodes (budgets by time)
        self.explore_every, self.learn = explore_every, learn
        self._refused_in_a_row = 0

    def observe_load(self, nbytes: int, seconds: float) -> None:
        """A load of `nbytes` took `seconds` (read, checks, written into the pool)."""
        self.bandwidth.observe(nbytes, seconds)

    def observe_step_load(self, nbytes: int, seconds: float) -> None:
        """The step's thread spent `seconds` on a load of `nbytes` (a read done there, checks, pool write, tree)."""
        self.step_load.observe(nbytes, seconds)

    def token_seconds(self) -> float:
        """One more prompt token's cost in a step: measured beside decodes (`StepTimes`) once it is; before, the
        slope over prefill steps (`MarginalCost`), or until their sizes spread the prior's (a small step's average
        carries the step's fixed part: it would make a block look cheap), never more than the average."""
        measured = self.steps.token_seconds
        return measured if measured is not None else self.prefill_token_seconds()

    def prefill_token_seconds(self) -> float:
        """One more prompt token's cost in a prefill step: the slope over prefill steps (`MarginalCost`), or until
        their sizes spread the prior's, never more than the average."""
        return min(self.marginal.seconds_per_token or self.prefill_prior_seconds, 1 / self.prefill.per_second)

    def block_tokens(self, nbytes: int) -> float:
        """Prompt tokens of forward that writing a block of `nbytes` on the step's thread costs as much as."""
        return nbytes / self.step_load.per_second / self.token_seconds()

    def prompt_budget(self, limit: int, ratio: float | None, num_decodes: int | None = None) -> int:
        """Prompt tokens (a local chunk and block writes together) a step with `num_decodes` decodes may take: at
        most `limit`, and with a `ratio`, at most what keeps the step within `ratio` decode-only steps of as many
        decodes (`StepTimes`); `limit` alone until that is measured."""
        budget = self.steps.budget(ratio, num_decodes) if ratio is not None else None
        return limit if budget is None else min(limit, budget)

    def pair_tokens(self, ratio: float | None) -> float:
        """With a `ratio` (steps sized by time), what one query x key pair of a chunk costs in prompt tokens of the
        step's budget (`StepTimes.pair_tokens`: a chunk after a long context is cut shorter); 0 without."""
        return self.steps.pair_tokens if ratio is not None else 0.0

    def pair_limit(self, ratio: float | None, limit: int) -> float | None:
        """With a `ratio`, the most query x key pairs one chunk may carry (`StepTimes.pair_limit`); None without."""
        return self.steps.pair_limit(limit) if ratio is not None else None

    def observe_step(self, num_tokens: int, num_prompt_tokens: int, seconds: float, num_pairs: int = 0) -> None:
        """A timed step (`num_pairs`: its prompt chunks' query x key pairs): one mostly of prompt tokens feeds the
        prefill rate too (`observe_prefill`)."""
        if 2 * num_prompt_tokens >= num_tokens:
            self.observe_prefill(num_tokens, seconds)
        self.steps.observe(num_tokens, num_prompt_tokens, seconds, num_pairs)

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        """A prefill step computed `num_tokens` in `seconds` (a token's cost there is `steps`' too)."""
        self.prefill.observe(num_tokens, seconds)
        self.marginal.observe(num_tokens, seconds)
        self.steps.prefill_token_seconds = self.prefill_token_seconds()

    def estimate(self, nbytes: int, num_tokens: int) -> CostEstimate:
        return CostEstimate(nbytes / self.bandwidth.per_second, num_tokens / self.prefill.per_second)

    def should_load(self, nbytes: int, num_tokens: int) -> bool:
        """Whether loading `nbytes` beats recomputing `num_tokens` (or it is time to try a load again)."""
        if self.estimate(nbytes, num_tokens).load_is_cheaper:
            self._refused_in_a_row = 0
            return True
        self._refused_in_a_row += 1
        if self.explore_every and self._refused_in_a_row >= self.explore_every:
            self._refused_in_a_row = 0
            return True
        return False

    def stats(self) -> dict[str, float]:
        return {"cost_bandwidth_bytes_per_s": self.bandwidth.per_second,
                "cost_prefill_tokens_per_s": self.prefill.per_second,
                "cost_load_samples": self.bandwidth.num_observations,
                "cost_prefill_samples": self.prefill.num_observations,
                "cost_step_load_bytes_per_s": self.step_load.per_second,
                "cost_token_seconds": self.token_seconds(),
                "cost_decode_step_seconds": self.steps.decode_step() or 0.0}


@dataclass(frozen=True, slots=True)
class StepSample:
    """One timed step (`StepClock.samples`)."""

    num_tokens: int  # tokens in all (decodes and prompt tokens)
    num_prompt_tokens: int
    num_pairs: int  # query x key pairs of its prompt chunks (`step_times.chunk_pairs`, summed)
    seconds: float


class StepClock:
    """Times the engine's steps: from the end of a step's scheduling (`start`; a load's block writes come before it,
    timed apart) to the step's end (`stop`, the engine's step listener `KVConnector.step_ended`). On a CUDA device
    two events are recorded instead of reading a clock (the forward runs asynchronously), and read once the device
    passed the second (`samples`), never waiting for it; on a CPU the stepping thread's CPU time (`work_clock`).
    Every step is timed (`StepTimes` needs decode-only steps and steps with prompt tokens beside decodes); one of
    mostly prompt tokens also feeds the prefill rate."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._now = work_clock(device)
        self._open: tuple[int, int, int, object] | None = None
        self._pending: list[tuple[int, int, int, object, object]] = []

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self._now()

    def start(self, num_tokens: int, num_prompt_tokens: int, num_pairs: int = 0) -> None:
        self._open = (num_tokens, num_prompt_tokens, num_pairs, self._mark()) if num_tokens else None

    def cancel(self) -> None:
        """Blocks stored outside a step's forward (a load, during scheduling): the open step is not timed."""
        self._open = None

    def stop(self) -> None:
        if self._open is not None:
            num_tokens, num_prompt_tokens, num_pairs, begin = self._open
            self._pending.append((num_tokens, num_prompt_tokens, num_pairs, begin, self._mark()))
            self._open = None

    def samples(self) -> list[StepSample]:
        """The timed steps that finished, each once."""
        done, waiting = [], []
        for num_tokens, num_prompt_tokens, num_pairs, begin, end in self._pending:
            if not self.cuda:
                done.append(StepSample(num_tokens, num_prompt_tokens, num_pairs, end - begin))  # type: ignore[operator]
            elif end.query():  # type: ignore[attr-defined]
                seconds = begin.elapsed_time(end) / 1000  # type: ignore[attr-defined]
                done.append(StepSample(num_tokens, num_prompt_tokens, num_pairs, seconds))
            else:
                waiting.append((num_tokens, num_prompt_tokens, num_pairs, begin, end))
        self._pending = waiting[-64:]
        return done
