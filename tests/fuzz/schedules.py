"""The master test under random schedules: a seed draws a model family, a `PagedConfig` (block size, step budget,
pool size down to preemption, chunking, prefix cache and its eviction policy, the disk tier, sparse prefill that
keeps every block), prompts that share prefixes or repeat, arrivals spread over steps, aborts, speculation (prompt
lookup or a draft model), `n` forks, EOS ids and seeded sampling; each greedy request's tokens must be stock
`generate`'s for that prompt alone, each seeded request's those of the same request alone in a default engine
without speculation (a seeded request's tokens depend on its prompt, parameters and seed only), the pool's integrity
holding after every step.

    python -m tests.fuzz.schedules --first-seed 0 --seeds 500      # prints every case that is not "ok"

Run on 2026-12-06 (session 23), before this module took its shape: 1,239 draws of seeds 1000-2238, all "ok", and a
few hundred more of its first version (seeds 5-~200: no failure but refusals of a then-unreachable combination).

Outcomes: "ok"; "refused" (a `PagedConfig` or `SamplingParams` the library turns down with a clear error: a
combination the draw does not avoid); "mismatch", "error" (a request failed), "hang" (no end after 5,000 steps).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
from dataclasses import dataclass

import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import FAMILIES, VOCAB, ragged_prompts, tiny_model

MAX_STEPS = 5000
_models: dict[str, torch.nn.Module] = {}
_stock: dict[tuple, list[int]] = {}


@dataclass
class Case:
    seed: int
    family: str
    config: dict
    prompts: list[list[int]]
    params: list[dict]  # SamplingParams fields ("draft_model": True means the model itself)
    arrivals: list[int]  # the step at which each request is added
    aborts: list[bool]  # aborted two steps after its arrival (its tokens are not compared)
    rounds: int = 1  # the same requests again, after the first round ended (prefix hits of finished requests)


def model_of(family: str) -> torch.nn.Module:
    if family not in _models:
        _models[family] = tiny_model(family)
    return _models[family]


def stock_tokens(family: str, prompt: list[int], max_new: int, eos: int | None) -> list[int]:
    """Stock greedy `generate` of one prompt alone, cut after its EOS."""
    key = (family, tuple(prompt), max_new, eos)
    if key not in _stock:
        extra = {} if eos is None else {"eos_token_id": eos, "pad_token_id": 0}
        out = model_of(family).generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                        max_new_tokens=max_new, do_sample=False, **extra)[0, len(prompt):].tolist()
        _stock[key] = out[: out.index(eos) + 1] if eos is not None and eos in out else out
    return _stock[key]


def seeded_alone(family: str, prompt: list[int], params: dict) -> list[int]:
    """A seeded request's tokens alone in a default engine, without speculation."""
    plain = {k: v for k, v in params.items() if k not in ("num_speculative_tokens", "prompt_lookup_max_ngram",
                                                           "draft_model", "num_return_sequences")}
    key = (family, tuple(prompt), tuple(sorted(plain.items())))
    if key not in _stock:
        engine = Engine(model_of(family), PagedConfig())
        request_id = engine.add_request(prompt, SamplingParams(**plain))
        while engine.has_unfinished:
            engine.step()
        _stock[key] = engine.pop_output(request_id).generated_tokens
    return _stock[key]


def draw(seed: int) -> Case:
    r = random.Random(seed)
    family = r.choice(sorted(FAMILIES))
    config: dict = {"block_size": r.choice([1, 2, 4, 8, 16, 32]), "max_num_batched_tokens": r.choice([4, 7, 16, 33, 64, 256]),
                    "max_num_seqs": r.choice([1, 2, 3, 8, 64]), "enable_prefix_caching": r.random() < 0.7,
                    "preemption_mode": r.choice(["recompute", "swap"]), "scheduling_policy": r.choice(["budget", "remaining"])}
    if config["enable_prefix_caching"]:
        config["prefix_eviction_policy"] = r.choice(["lru", "lfu", "cost", "slru"])
    if r.random() < 0.3:
        config.update(enable_chunked_prefill=False, max_num_batched_tokens=256)
    elif r.random() < 0.3:
        config["max_prefill_tokens_per_step"] = r.choice([1, 5, 17])
    if r.random() < 0.15 and family not in ("gemma2", "mistral"):  # every block kept: dense attention's tokens
        config.update(sparse_prefill=r.choice(["vertical_slash", "block"]), sparse_prefill_min_tokens=8,
                      sparse_keep_ratio=1.0)
    base = ragged_prompts([r.randint(1, 60)], seed=seed)[0]
    prompts: list[list[int]] = []
    for i in range(r.randint(1, 7)):
        kind = r.random()
        if kind < 0.3 and prompts:
            prompts.append(list(r.choice(prompts)))
        elif kind < 0.6:
            prompts.append(base[: r.randint(0, len(base))] + ragged_prompts([r.randint(1, 30)], seed=seed * 31 + i)[0])
        else:
            prompts.append(ragged_prompts([r.randint(1, 70)], seed=seed * 17 + i)[0])
    if r.random() < 0.5:  # a pool from just one request's blocks (preemption) to plenty
        need = -(-(max(map(len, prompts)) + 40) // config["block_size"]) + 1
        config["num_blocks"] = r.choice([need, need + 2, 2 * need, 512 // config["block_size"] + 8])
    if r.random() < 0.15:
        config.update(kv_offload_dir="", enable_prefix_caching=True)  # (a temporary directory when it runs)
    params = []
    for _ in prompts:
        p: dict = {"max_new_tokens": r.randint(1, 30)}
        eos = r.choice([None, None, r.randint(3, VOCAB - 1)])
        if eos is not None:
            p["eos_token_id"] = eos
        speculation = r.random()
        if speculation < 0.15:
            p.update(num_speculative_tokens=r.randint(1, 4), prompt_lookup_max_ngram=r.randint(1, 3))
        elif speculation < 0.25:
            p.update(num_speculative_tokens=r.randint(1, 4), draft_model=True)
        if r.random() < 0.25:
            p.update(do_sample=True, seed=r.randint(0, 2**31), temperature=r.choice([0.5, 1.0, 1.5]))
            if r.random() < 0.5:
                p.update(top_k=r.choice([2, 10]), top_p=r.choice([0.5, 0.9, 1.0]))
        elif r.random() < 0.1:
            p["num_return_sequences"] = r.randint(2, 3)
        params.append(p)
    rounds = 2 if config["enable_prefix_caching"] and r.random() < 0.5 else 1
    return Case(seed, family, config, prompts, params, [r.randint(0, 6) for _ in prompts],
                [r.random() < 0.1 for _ in prompts], rounds)


def run(case: Case) -> tuple[str, str]:
    """(outcome, detail) of one case."""
    config = dict(case.config)
    directory = tempfile.mkdtemp(prefix="hf_paged_fuzz_") if "kv_offload_dir" in config else None
    if directory is not None:
        config["kv_offload_dir"] = directory
    try:
        return _run(case, config)
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _run(case: Case, config: dict) -> tuple[str, str]:
    model = model_of(case.family)
    try:
        engine = Engine(model, PagedConfig(**config))
        params = [SamplingParams(**{**p, **({"draft_model": model} if p.get("draft_model") else {})})
                  for p in case.params]
    except (ValueError, TypeError) as exc:
        return "refused", str(exc)
    order = sorted(range(len(case.prompts)), key=case.arrivals.__getitem__)
    for round_ in range(case.rounds):
        pending, ids, aborted, step = list(order), {}, set(), 0
        while pending or engine.has_unfinished:
            while pending and case.arrivals[pending[0]] <= step:
                i = pending.pop(0)
                try:
                    ids[i] = engine.add_request(case.prompts[i], params[i])
                except (ValueError, TypeError) as exc:
                    return "refused", str(exc)
            if engine.has_unfinished:
                engine.step()
                engine.check_integrity()
                for i, request_id in ids.items():
                    if case.aborts[i] and i not in aborted and step >= case.arrivals[i] + 2:
                        engine.abort(request_id)
                        aborted.add(i)
            step += 1
            if step > MAX_STEPS:
                return "hang", f"round {round_}: no end after {MAX_STEPS} steps"
        for i, request_id in ids.items():
            out = engine.pop_output(request_id)
            if i in aborted:
                continue
            if out.error is not None:
                return "error", f"request {i}, round {round_}: {out.error}"
            if case.params[i].get("do_sample"):
                want = seeded_alone(case.family, case.prompts[i], case.params[i])
            else:
                want = stock_tokens(case.family, case.prompts[i], case.params[i]["max_new_tokens"],
                                    case.params[i].get("eos_token_id"))
            if out.generated_tokens != want:
                return "mismatch", f"request {i}, round {round_}: {out.generated_tokens} != stock {want}"
    return "ok", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=100)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    counts: dict[str, int] = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        case = draw(seed)
        outcome, detail = run(case)
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome != "ok":
            print(f"seed {seed}: {outcome}: {detail[:500]}\n  {case.family} {case.config} {case.params}", flush=True)
    print(counts)
    return 0 if set(counts) <= {"ok", "refused"} else 1


if __name__ == "__main__":
    raise SystemExit(main())
