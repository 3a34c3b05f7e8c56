"""A seeded random driver of the Engine (helper h53's fuzzer, kept as a test): scheduling, preemption (recompute and
swap), the prefix cache (pins, resets, eviction policies), forks, aborts in every phase, constraints, speculation,
failing processors, logprobs, streaming. Per seed: pool integrity after every operation, every block back at the end,
every greedy request not aborted or failed equal to stock `generate`, pool failures only for requests that cannot
fit, the engine usable afterwards. `run_seed` returns the problems found (none expected).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hf_paged import (
    ChoiceLogitsProcessor,
    Engine,
    JSONSchemaLogitsProcessor,
    PagedConfig,
    RegexLogitsProcessor,
    RequestStatus,
    SamplingParams,
)
from hf_paged.batching.request import fork_ids
from hf_paged.errors import PrefixPinLimitError
from tests.tiny_models import byte_tokenizer

TOK = byte_tokenizer()
EOS = TOK.eos_token_id
VOCAB = len(TOK)
MAX_POS = 512
MAX_PROMPT, MAX_NEW = 200, 40
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                            "k": {"enum": ["cat", "dog"]}},
          "required": ["n", "k"], "additionalProperties": False}


def make_model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    common = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "max_position_embeddings": MAX_POS, "eos_token_id": None,
                  "pad_token_id": EOS,
                  "bos_token_id": None}
    if name == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_key_value_heads=4, **common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=1, **common))  # GQA 4:1
    model = model.eval()
    model.config._attn_implementation = "sdpa"
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = EOS
    return model


CONSTRAINTS = {}
RESET_P = 0.04  # chance of reset_prefix_cache() after a step operation


def constraint(kind: str):
    if kind not in CONSTRAINTS:
        CONSTRAINTS[kind] = {
            "json": lambda: JSONSchemaLogitsProcessor(SCHEMA, TOK),
            "regex": lambda: RegexLogitsProcessor(r"[0-9]{2,4}-[a-c]{1,3}", TOK),
            "choice": lambda: ChoiceLogitsProcessor(["yes", "no", "maybe later"], TOK),
        }[kind]()
    return CONSTRAINTS[kind]


class Boom(Exception):
    pass


class RaisingProcessor:
    """Raises on its `after`-th call (counted per instance: one instance per request)."""

    def __init__(self, after: int):
        self.after, self.calls = after, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls > self.after:
            raise Boom(f"processor raised at call {self.calls}")
        return scores


class Stock:
    """Stock greedy continuations, computed once per (model, prompt, constraint) to MAX_NEW tokens (no EOS), then
    cut: greedy is deterministic, so max_new_tokens m is the first m tokens and a stop id ends at its first hit."""

    def __init__(self, model):
        self.model, self.memo = model, {}

    def full(self, prompt, ckind):
        key = (tuple(prompt), ckind)
        if key not in self.memo:
            kwargs = {}
            if ckind is not None:
                kwargs = {"logits_processor": [constraint(ckind)], "eos_token_id": EOS}
            mask = torch.ones(1, len(prompt), dtype=torch.long)
            out = self.model.generate(torch.tensor([prompt]), attention_mask=mask,
                                      max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=EOS, **kwargs)
            self.memo[key] = out[0, len(prompt):].tolist()
        return self.memo[key]

    def expect(self, prompt, max_new, stop_ids, ckind):
        toks = self.full(prompt, ckind)[:max_new]
        stops = set(stop_ids or []) | ({EOS} if ckind is not None else set())
        for i, t in enumerate(toks):
            if t in stops:
                return toks[: i + 1]
        return toks


@dataclass
class Spec:
    rid: str
    prompt: list[int]
    max_new: int
    kind: str  # greedy | sampled | raising | constrained | spec
    stop_ids: list[int] | None = None
    ckind: str | None = None
    n: int = 1
    aborted_at: str | None = None  # phase when aborted
    streamed: dict = field(default_factory=dict)
    k: int = 0
    aborted_ids: dict = field(default_factory=dict)  # id -> phase at abort


ALLOWED = ("sampled", "n", "stop", "constrained", "raising", "spec", "logprobs", "pin")


class Failure(Exception):
    pass


def pick_config(rng: random.Random) -> PagedConfig:
    bs = rng.choice([1, 2, 4, 8, 16])
    per_req = -(-(MAX_PROMPT + MAX_NEW + 16) // bs) + 1
    r = rng.random()
    if r < 0.4:  # below one longest request: some cannot fit at all (they must fail alone, OutOfBlocks)
        num_blocks = rng.randint(max(2, per_req // 3), per_req)
    else:
        num_blocks = per_req + (rng.randint(0, per_req // 4) if r < 0.8 else rng.randint(per_req // 4, 3 * per_req))
    return PagedConfig(
        block_size=bs, num_blocks=num_blocks, max_num_batched_tokens=rng.randint(8, 128),
        max_num_seqs=rng.randint(1, 8), enable_prefix_caching=True,
        preemption_mode=rng.choice(["recompute", "swap"]),
        scheduling_policy=rng.choice(["budget", "remaining"]),
        prefix_eviction_policy=rng.choice(["lru", "lru", "lfu", "cost", "slru"]),
    )


def make_prompts(rng: random.Random):
    bases = [[rng.randint(0, VOCAB - 2) for _ in range(rng.randint(1, 160))] for _ in range(3)]

    def prompt():
        if rng.random() < 0.7:
            base = rng.choice(bases)
            cut = rng.randint(1, len(base))
            p = base[:cut] + [rng.randint(0, VOCAB - 2) for _ in range(rng.randint(0, 40))]
        else:
            p = [rng.randint(0, VOCAB - 2) for _ in range(rng.randint(1, MAX_PROMPT))]
        return p[:MAX_PROMPT]

    return prompt


def add_one(engine, rng, prompt_fn, specs, stock, allowed):
    prompt = prompt_fn()
    max_new = rng.randint(1, MAX_NEW)
    params = {"max_new_tokens": max_new}
    spec = Spec("", prompt, max_new, "greedy")
    spec.k = 0
    procs = []
    if rng.random() < 0.12 and "sampled" in allowed:
        spec.kind = "sampled"
        params.update(do_sample=True, seed=rng.randint(0, 1000), temperature=0.8)
    if rng.random() < 0.15 and "n" in allowed:
        spec.n = rng.randint(2, 3)
        params.update(num_return_sequences=spec.n)
    if rng.random() < 0.15 and "constrained" in allowed:
        spec.ckind = rng.choice(["json", "regex", "choice"])
        procs.append(constraint(spec.ckind))
        params.update(eos_token_id=EOS)
    elif rng.random() < 0.15 and "stop" in allowed:
        full = stock.full(prompt, None)
        first = rng.choice(full[: max(1, max_new)])  # (the draws in the order the seeds were found with)
        spec.stop_ids = [first] + ([rng.randint(0, VOCAB - 1)] if rng.random() < 0.5 else [])
        params.update(eos_token_id=spec.stop_ids)
    if rng.random() < 0.08 and "raising" in allowed:
        spec.kind = "raising"
        procs.append(RaisingProcessor(rng.randint(0, 5)))
    if rng.random() < 0.15 and "spec" in allowed:
        spec.k = rng.randint(1, 8)
        params.update(num_speculative_tokens=spec.k)
        spec.kind += "+spec"
    if rng.random() < 0.1 and "logprobs" in allowed:
        params.update(logprobs=rng.randint(0, 3))
    if procs:
        params.update(logits_processors=procs)
    sp = SamplingParams(**params)
    priority = rng.choice([0, 0, 0, 1, -1])
    spec.rid = engine.add_request(prompt, sp, priority=priority)
    specs.append(spec)
    return spec


def pinned_blocks(engine):
    radix = engine.kv.prefix_cache
    return len(radix.pinned_ref_counts()) if radix is not None else 0


def phase_of(engine, rid):
    req = engine.requests.get(rid)
    if req is None:
        return "popped"
    if req.ended:
        return "finished"
    if req.status == RequestStatus.PREEMPTED:
        return "preempted"
    if req.num_computed_tokens == 0:
        return "before_prefill"
    if req.num_computed_tokens < len(req.prompt_ids):
        return "mid_prefill"
    return "mid_decode"


def run_seed(seed: int, model_name: str, models) -> list[str]:
    rng = random.Random(seed)
    rng2 = random.Random(seed + 10**6)
    model, stock = models[model_name]
    config = pick_config(rng)
    engine = Engine(model, config)
    prompt_fn = make_prompts(rng)
    allowed = set(ALLOWED)
    specs: list[Spec] = []
    ops = []
    pins = []
    num_ops = rng.randint(4, 40)
    use_stream = rng.random() < 0.3
    for _ in range(num_ops):
        r = rng.random()
        if r < 0.05 and "pin" in allowed and specs:
            p = rng.choice(specs).prompt
            if rng.random() < 0.6:
                try:
                    ops.append(("pin", len(p), engine.pin_prefix(p)))
                    pins.append(p)
                except PrefixPinLimitError:
                    ops.append(("pin-refused", len(p)))
            elif pins:
                up = pins.pop(rng.randrange(len(pins)))
                ops.append(("unpin", engine.unpin_prefix(up)))
            engine.check_integrity()
        elif r < 0.45:
            s = add_one(engine, rng, prompt_fn, specs, stock, allowed)
            ops.append(("add", s.rid, s.kind, len(s.prompt), s.max_new))
        elif r < 0.80:
            k = rng.randint(1, 4)
            for _ in range(k):
                engine.step()
                engine.check_integrity()
            ops.append(("step", k))
            if rng2.random() < RESET_P:  # (a second generator: the main one's draws, so the seeds, stay as they were)
                engine.reset_prefix_cache()
                engine.check_integrity()
                ops.append(("reset_prefix_cache",))
        else:
            targets = [s for s in specs if not s.aborted_at]
            if targets:
                s = rng.choice(targets)
                ph = phase_of(engine, s.rid)
                if ph == "popped":
                    continue
                if ph != "finished":
                    s.aborted_at = ph
                engine.abort(s.rid)
                s.aborted_ids = {s.rid: ph}
                if s.n > 1 and rng.random() < 0.5:  # as the engine loop does: abort every fork id too
                    for cid in fork_ids(s.rid, s.n)[1:]:
                        s.aborted_ids[cid] = phase_of(engine, cid)
                        engine.abort(cid)
                engine.check_integrity()
                ops.append(("abort", s.rid, ph, s.n))
    # run to completion (streaming or stepping)
    steps = 0
    streamed = {}
    if use_stream:
        for rid, toks, fin in engine.stream():
            streamed.setdefault(rid, []).extend(toks)
            engine.check_integrity()
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
        steps += 1
        if steps > 20000:
            raise Failure(f"hang: still unfinished after 20000 steps: {[r.request_id for r in engine.live_requests()]}")
    engine.check_integrity()
    problems = []
    outs = {}
    for rid in list(engine.requests):
        outs[rid] = engine.pop_output(rid)
    for rid, toks in streamed.items():
        if rid in outs and toks != outs[rid].generated_tokens:
            problems.append(f"{rid}: streamed {toks[:8]}.. ({len(toks)}) != output {outs[rid].generated_tokens[:8]}.. "
                            f"({len(outs[rid].generated_tokens)})")
    for s in specs:
        ids = fork_ids(s.rid, s.n)
        for rid in ids:
            o = outs.get(rid)
            if o is None:
                problems.append(f"{rid}: no output")
                continue
            ab = s.aborted_ids.get(rid)
            if ab is not None and ab in ("finished", "popped"):
                ab = None
            if rid != s.rid and ab is None and s.aborted_at and o.finish_reason == "abort":
                continue  # a fork still waiting for its parent's first token ends with the parent
            if ab is not None:
                if o.status == RequestStatus.FINISHED:
                    problems.append(f"{rid}: aborted at {ab} but FINISHED")
                elif o.finish_reason != "abort" and not (s.kind.startswith("raising") and o.finish_reason == "error"):
                    problems.append(f"{rid}: aborted, finish_reason {o.finish_reason} err {o.error}")
                continue
            if s.kind.startswith("raising"):
                continue  # failed at its processor's call, or finished before it
            if o.status != RequestStatus.FINISHED and o.error_type is not None and o.error_type.__name__ in (
                    "OutOfBlocksError", "PromptTooLongError"):
                need = -(-(len(s.prompt) + s.max_new) // config.block_size)
                if need > config.num_blocks - pinned_blocks(engine) or s.n > 1 or s.k:
                    continue  # it cannot fit beside what the seed pinned: a pool failure is its answer
                problems.append(f"{rid}: {o.error_type.__name__} though {need} blocks of {config.num_blocks} "
                                f"(pinned {pinned_blocks(engine)}) would do: {o.error}")
                continue
            if o.status != RequestStatus.FINISHED:
                problems.append(f"{rid} ({s.kind}, prompt {len(s.prompt)}, new {s.max_new}): {o.status} "
                                f"{o.finish_reason} {o.error}")
                continue
            if s.kind.startswith("sampled"):
                if not 1 <= len(o.generated_tokens) <= s.max_new:
                    problems.append(f"{rid}: sampled, {len(o.generated_tokens)} tokens for max {s.max_new}")
                continue
            want = stock.expect(s.prompt, s.max_new, s.stop_ids, s.ckind)
            if o.generated_tokens != want:
                first = next((i for i, (a, b) in enumerate(zip(o.generated_tokens, want)) if a != b),
                             min(len(want), len(o.generated_tokens)))
                problems.append(f"{rid} ({s.kind} {s.ckind or ''} stop={s.stop_ids} prompt {len(s.prompt)} new "
                                f"{s.max_new}): tokens differ from stock at {first}: got {len(o.generated_tokens)} "
                                f"{o.generated_tokens[first:first+5]} want {len(want)} {want[first:first+5]}")
    pool = engine.cache.pool
    for p in pins:
        engine.unpin_prefix(p)
    engine.check_integrity()
    if pool.num_used_blocks != 0:
        problems.append(f"leak: {pool.num_used_blocks} blocks used after all requests popped "
                        f"(free {pool.num_free_blocks}, cached {pool.num_cached_blocks})")
    # usable afterwards
    p = prompt_fn()[: max(1, (config.num_blocks - pinned_blocks(engine)) * config.block_size // 2 - 8)]
    rid = engine.add_request(p, SamplingParams(max_new_tokens=8))
    o = engine.run([rid])[rid]
    if o.status != RequestStatus.FINISHED or o.generated_tokens != stock.expect(p, 8, None, None):
        problems.append(f"after-run request: {o.status} {o.error} {o.generated_tokens}")
    engine.check_integrity()
    if pool.num_used_blocks != 0:
        problems.append(f"leak after the extra request: {pool.num_used_blocks}")
    if problems:
        problems.append(f"seed {seed} ({model_name}): config {config}; operations {ops}")
    return problems
