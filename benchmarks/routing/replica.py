"""A continuous-batching replica of the routing simulator: a token budget per step shared by a decode batch and
prefill chunks, an LRU prefix cache closed under prefixes (as the radix tree is).

One step, planned when the previous one ends (vLLM's order):

    admit waiting requests (FIFO, up to MAX_NUM_SEQS running): look up their prefix, the rest is prefill to do
    budget = MAX_BATCH_TOKENS:  every decoding request 1 token  |  prefill chunks in admission order, the rest
    time   = STEP_S + STEP_TOKEN_S * tokens in the step

A prefill that completes gives the request its first token at the end of that step (TTFT) and caches its prompt's
full blocks; a request that ends caches its output's blocks too. While only decodes run and nobody waits, k equal
steps are one event (k = the fewest output tokens any running request has left), cut short when a request arrives.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice

from hf_paged.cache.block_events import BlockEventKind

__all__ = ["MAX_BATCH_TOKENS", "MAX_NUM_SEQS", "MAX_TOKENS", "STEP_S", "STEP_TOKEN_S", "Replica", "SimEvents",
           "SimRequest", "Step"]

MAX_BATCH_TOKENS = 8192  # token budget of a step (max_num_batched_tokens)
MAX_NUM_SEQS = 128  # running requests at most
STEP_S = 0.010  # fixed cost of a step (launches, sampling)
STEP_TOKEN_S = 6e-5  # cost per token in the step: a full 8k-token prefill step takes ~0.5 s (~16k tokens/s)
MAX_TOKENS = 512  # every request's max_tokens, or its output length when longer
STORED, REMOVED = int(BlockEventKind.STORED), int(BlockEventKind.REMOVED)


@dataclass(slots=True, eq=False)
class SimRequest:
    rid: int
    session: int
    turn: int
    arrival: float
    keys: list[int]  # the prompt's full blocks
    num_prompt_tokens: int
    num_output_tokens: int  # what it will generate (unknown to routers and load reports: they see max_tokens)
    out_keys: list[int] = field(default_factory=list)  # prompt + output blocks, cached when it ends
    replica: int = -1
    hit_tokens: int = 0
    prompt_left: int = 0
    output_left: int = 0
    first_token: float = -1.0
    predicted_blocks: int = -1  # what ours believed the replica held (-1: other policies)
    route: object = None  # the policy's own record (ours: RouteRequest, decision)

    @property
    def max_tokens(self) -> int:
        """The output budget a client asks for: what routers and load reports count, never the true length."""
        return max(MAX_TOKENS, self.num_output_tokens)


@dataclass(frozen=True, slots=True)
class SimEvents:
    kinds: bytes  # a `BlockEventKind` an event
    keys: list[int]  # the block each event is about


@dataclass(slots=True)
class Step:
    start: float
    duration: float  # of one step
    count: int  # equal decode-only steps in this event (1 when prefill runs)
    decodes: list[SimRequest]
    chunks: list[tuple[SimRequest, int]]

    @property
    def end(self) -> float:
        return self.start + self.duration * self.count


class Replica:
    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.members: set[int] = set()  # the cache's keys again: a set copies ~7x faster than an OrderedDict
        self._summary: frozenset[int] | None = None  # the last summary, while the cache has not changed
        self.event_kinds: bytearray | None = None  # block events since the last report (None: not recorded)
        self.event_keys: list[int] = []
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.step: Step | None = None
        self.version = 0  # bumped when the pending step event is replaced
        self.work_tokens = 0  # tokens computed (prefill + decode): the replica's work
        self.busy_s = 0.0

    # -- the prefix cache ----------------------------------------------------------------------------------
    def cached_blocks(self, keys: list[int]) -> int:
        """Leading keys cached; the cache is closed under prefixes, so a binary search."""
        cache = self.cache
        if not keys or keys[0] not in cache:
            return 0
        low, high = 1, len(keys)
        while low < high:
            mid = (low + high + 1) // 2
            if keys[mid - 1] in cache:
                low = mid
            else:
                high = mid - 1
        return low

    def touch(self, keys: list[int]) -> None:
        cache, members = self.cache, self.members
        for key in reversed(keys):  # parents last: most recent, evicted after their children
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = None
                members.add(key)
                self._summary = None
                if self.event_kinds is not None:
                    self.event_kinds.append(STORED)
                    self.event_keys.append(key)
        for _ in range(len(cache) - self.capacity):
            key = cache.popitem(last=False)[0]
            members.discard(key)
            if self.event_kinds is not None:
                self.event_kinds.append(REMOVED)
                self.event_keys.append(key)

    def take_events(self) -> SimEvents:
        """The block events since the last call, in order, as `RadixCache.listen()` records them; starts
        recording on the first call."""
        events = SimEvents(bytes(self.event_kinds or b""), self.event_keys)
        self.event_kinds, self.event_keys = bytearray(), []
        return events

    def summary(self, cap: int) -> frozenset[int]:
        """The `cap` most recently used keys (prefix-closed, like `RadixCache.cached_digests`)."""
        if len(self.cache) > cap:
            return frozenset(islice(reversed(self.cache), cap))
        if self._summary is None:
            self._summary = frozenset(self.members)
        return self._summary

    # -- load ----------------------------------------------------------------------------------------------
    @property
    def ongoing(self) -> int:
        return len(self.waiting) + len(self.running)

    def load_tokens(self, now: float) -> int:
        """Queued + running tokens as `engine_load_tokens` counts them: prompt left + output budget left (max_tokens
        less what was generated, not the true remainder)."""
        load = sum(r.num_prompt_tokens - min(self.cached_blocks(r.keys) * self.block_size, r.num_prompt_tokens - 1)
                   + r.max_tokens for r in self.waiting)
        done = 0
        if self.step is not None and self.step.count > 1:
            done = min(self.step.count, int((now - self.step.start) / self.step.duration))
        return load + sum(r.prompt_left + r.max_tokens - (r.num_output_tokens - r.output_left) - done
                          for r in self.running)

    # -- steps ---------------------------------------------------------------------------------------------
    def plan(self, now: float) -> Step | None:
        """The next step from `now` (None when idle)."""
        bs = self.block_size
        while self.waiting and len(self.running) < MAX_NUM_SEQS:
            r = self.waiting.popleft()
            r.hit_tokens = min(self.cached_blocks(r.keys) * bs, r.num_prompt_tokens - 1)
            self.touch(r.keys[: r.hit_tokens // bs])
            r.prompt_left, r.output_left = r.num_prompt_tokens - r.hit_tokens, r.num_output_tokens
            self.running.append(r)
        if not self.running:
            self.step = None
            return None
        decodes = [r for r in self.running if r.prompt_left == 0]
        budget, chunks = MAX_BATCH_TOKENS - len(decodes), []
        for r in self.running:
            if budget <= 0:
                break
            if r.prompt_left > 0:
                take = min(r.prompt_left, budget)
                chunks.append((r, take))
                budget -= take
        tokens = MAX_BATCH_TOKENS - budget
        count = min(r.output_left for r in decodes) if decodes and not chunks and not self.waiting else 1
        self.step = Step(now, STEP_S + STEP_TOKEN_S * tokens, max(1, count), decodes, chunks)
        self.version += 1
        return self.step

    def cut(self, now: float) -> Step | None:
        """A request arrived at `now`: end a multi-step decode event at the step in progress. Returns the step
        when it was cut (its end event must be replaced), else None."""
        step = self.step
        if step is None or step.count == 1:
            return None
        done = int((now - step.start) / step.duration) + 1
        if done >= step.count:
            return None
        step.count = done
        self.version += 1
        return step

    def finish_step(self) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply the step that just ended: (requests that got their first token, requests that ended)."""
        step = self.step
        assert step is not None
        end, first, ended = step.end, [], []
        self.busy_s += step.duration * step.count
        self.work_tokens += len(step.decodes) * step.count + sum(take for _, take in step.chunks)
        for r in step.decodes:
            r.output_left -= step.count
        for r, take in step.chunks:
            r.prompt_left -= take
            if r.prompt_left == 0:
                r.first_token, r.output_left = end, r.output_left - 1
                self.touch(r.keys)
                first.append(r)
        for r in self.running:
            if r.prompt_left == 0 and r.output_left <= 0:
                self.touch(r.out_keys)
                ended.append(r)
        if ended:
            gone = set(map(id, ended))
            self.running = [r for r in self.running if id(r) not in gone]
        self.step = None
        return first, ended
