"""Structured programs (issue 40): templates filled item by item vs one shot vs the naive way, dialog flows through
`run_batch` vs stock `generate` one flow at a time, and `select` against a brute-force stock computation.

1. A 6-field record (`TEMPLATE`: two choice fields, four JSON string fields) after a support ticket, filled
   - item_by_item: `hp.fill(mode="item_by_item")` (choices scored by `select`, each text field its own request,
     its next literal forced in the same request);
   - one_shot: `hp.fill(mode="one_shot")` (one request, the template as one regex, literals by jump-forward);
   - naive: one stock `generate` per field over the whole context so far (the field's regex and its next literal
     enforced with `RegexLogitsProcessor`; what a user writes by hand without a cache).
   Reported: prompt tokens computed (prefill: prompt tokens not served from the prefix cache), all tokens computed
   (every token of every forward: prefill, jump-forward chunks, decode), forward passes, wall and CPU seconds, and
   whether the result parses as JSON. Greedy; each run starts with an empty prefix cache; median of `--repeats`.
   Targets: item_by_item computes <= 1.3x the prompt tokens of one_shot; the naive way >= 3x.
2. 64 dialog flows (`flow`: a shared system prompt, a ticket, a `select` of the intent, a branch on it, two
   `gen`s) through `run_batch`, vs the same flows one after another with stock calls (the select as one stock
   forward per choice, each gen a stock greedy `generate` with its stop string). Flows per second, the prefix hit
   rate of the batch, and how many flows gave the same fields both ways (greedy). Target: >= 3x.
3. `select` on 100 random cases (a random context, 2-5 random choices) against the summed log-probabilities of one
   stock forward per choice: the largest difference and how often the pick agrees.
4. Token healing (`hp.gen(..., heal=True)`): free fields after text ending in a space, a colon or a space and a
   quote; how many tokens extend the prompt's last token, how often the healed first token is another token than
   the one given back, and how many fields change.
5. With `--http`: the record (item by item, one shot) and the dialog flows in process vs over HTTP
   (`hp.remote(url)` against `hf-paged serve` on 127.0.0.1, uvicorn in a thread of this process, an engine with the
   same settings over a copy of the weights). Interleaved repeats; prompt tokens prefilled and from the cache (the
   program's counts), all tokens computed (the serving engine's counter), wall and CPU seconds (CPU: this process,
   client and server together), and whether the fields equal the in-process ones. `--only-http`: this section only.

The record table runs at each of `--block-sizes` (default 16, the engine's default, and 4): item by item, each call
computes again the last partial block of the text before it (the prefix cache holds full blocks only).

Models: the embedded model (`hf_paged.default_model()`, a 2.3M byte-level Llama) and, with `--llama55m`, a random
55M Llama (hidden 384, 8 layers, GPT-2's tokenizer from `--gpt2`). One torch thread (`--threads`).

Usage:
    python benchmarks/programs.py [--repeats 3] [--llama55m] [--out benchmarks/programs_results.md]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hf_paged
from benchmarks.common import machine, print_table
from hf_paged import programs as hp
from hf_paged.api.wrap_state import engine_of
from hf_paged.processors import RegexLogitsProcessor
from hf_paged.processors.choice import escape_regex
from hf_paged.programs.constraints import regex_text
from hf_paged.programs.template import parse_template

PROMPT = ("Support ticket #4411 from a customer of the bank:\n"
          "Hello, I bought a train ticket on Monday and my card was charged twice for the same purchase. I called "
          "the number on the back of the card but nobody answered. Please refund the second charge and tell me "
          "what I should do next. I have attached the receipt from the station.\n"
          "Fill in the triage record as JSON.\n")
TEMPLATE = ('{"intent": "[intent]", "priority": "[priority]", "summary": "[summary]", "reply": "[reply]", '
            '"next_step": "[next_step]", "tag": "[tag]"}')


def holes() -> dict:
    return {"intent": ["billing", "complaint", "fraud", "other"], "priority": ["low", "medium", "high"],
            "summary": hp.text(max_tokens=24), "reply": hp.text(max_tokens=32), "next_step": hp.text(max_tokens=16),
            "tag": hp.text(max_tokens=8)}


SYSTEM = ("You are the support assistant of a bank. Read the customer's ticket, decide what it is about, answer "
          "in one short line, and suggest the next step. Be polite and precise; never ask for a password.\n")
ISSUES = ["my card was charged twice", "I want to close my account", "the app crashes at login",
          "a payment I did not make", "my statement is missing", "the ATM kept my card", "fees look wrong",
          "I moved house"]
MOODS = ["Please help.", "This is the third time I write!", "Thanks in advance.", "I am very upset."]


@hp.program
def flow(s, ticket):
    s += SYSTEM + "Ticket: " + ticket + "\nIntent: " + hp.select("intent", ["billing", "complaint", "other"]) + "\n"
    if s["intent"] == "complaint":
        s += "Apology: " + hp.gen("first", max_tokens=16, stop="\n") + "\n"
    else:
        s += "Answer: " + hp.gen("first", max_tokens=16, stop="\n") + "\n"
    s += "Next step: " + hp.gen("next", max_tokens=16, stop="\n")


def tickets(n: int) -> list[str]:
    return [f"{ISSUES[i % len(ISSUES)]} (order {1000 + 37 * i}). {MOODS[i % len(MOODS)]}" for i in range(n)]


# -- 1. a 6-field record ----------------------------------------------------------------------------------------
def _counters(engine) -> tuple[int, int]:
    return engine.metrics.num_computed_tokens, engine.metrics.num_steps


def run_fill(model, tok, mode: str, score_choices: bool = True, engine=None) -> dict:
    """`model`: a model, or a program backend (then `engine` is the engine serving it)."""
    engine = engine or engine_of(model)
    engine.reset_prefix_cache()
    computed, steps = _counters(engine)
    wall, cpu = time.perf_counter(), time.process_time()
    filled = hp.fill(model, tok, PROMPT, TEMPLATE, mode=mode, score_choices=score_choices, **holes())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"prompt": filled.tokens.prefilled, "cached": filled.tokens.cached,
            "computed": engine.metrics.num_computed_tokens - computed, "forwards": engine.metrics.num_steps - steps,
            "wall": wall, "cpu": cpu, "valid": _valid(filled.text), "text": filled.text, "fields": filled.fields}


def run_naive(model, tok) -> dict:
    """One stock `generate` per field over the whole context, the field held to its regex and next literal."""
    plan = parse_template(TEMPLATE, holes())
    context = PROMPT + plan.literals[0]
    prompt = computed = forwards = 0
    wall, cpu = time.perf_counter(), time.process_time()
    eos = tok.eos_token_id
    for i, hole in enumerate(plan.holes):
        literal = plan.next_literal(i)
        flat = regex_text(hole.constraint, json_string=hole.json_string, stop_char=literal[:1] or None)
        processor = RegexLogitsProcessor(flat + escape_regex(literal), tok, eos_token_id=eos)
        ids = tok(context)["input_ids"]
        out = type(model).generate(model, torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=hole.constraint.max_tokens + len(literal.encode()) + 1,
                                   do_sample=False, logits_processor=[processor], eos_token_id=eos, pad_token_id=eos)
        new = out[0, len(ids):].tolist()
        prompt += len(ids)
        computed += len(ids) + len(new) - 1
        forwards += len(new)
        text = tok.decode([t for t in new if t != eos])
        context += text if text.endswith(literal) else text + literal
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    filled = context[len(PROMPT):]
    return {"prompt": prompt, "computed": computed, "forwards": forwards, "wall": wall, "cpu": cpu,
            "valid": _valid(filled), "text": filled}


def _valid(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def bench_record(model, tok, repeats: int) -> tuple[list[list], dict]:
    runs = {"item_by_item": lambda: run_fill(model, tok, "item_by_item"),
            "item_by_item, choices generated": lambda: run_fill(model, tok, "item_by_item", score_choices=False),
            "one_shot": lambda: run_fill(model, tok, "one_shot"), "naive": lambda: run_naive(model, tok)}
    for run in runs.values():
        run()  # warm-up: constraint indexes compiled, kernels loaded
    medians = {}
    for name, run in runs.items():
        results = [run() for _ in range(repeats)]
        medians[name] = _median(results)
    base = medians["one_shot"]
    rows = [[name, m["prompt"], f"{m['prompt'] / base['prompt']:.2f}x", m["computed"],
             f"{m['computed'] / base['computed']:.2f}x", m["forwards"], m["wall"], m["cpu"],
             "yes" if m["valid"] else "NO"] for name, m in medians.items()]
    return rows, medians


# -- 2. dialog flows ------------------------------------------------------------------------------------------
def stock_flow(model, tok, ticket: str) -> dict:
    context = SYSTEM + "Ticket: " + ticket + "\nIntent: "
    ctx_ids = tok(context)["input_ids"]
    scores = {}
    for choice in ("billing", "complaint", "other"):
        ids = tok(choice, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ctx_ids + ids[:-1]])).logits[0].float()
        rows = torch.log_softmax(logits, -1)[len(ctx_ids) - 1:]
        scores[choice] = rows.gather(1, torch.tensor(ids)[:, None]).sum().item()
    intent = max(scores, key=scores.get)
    fields = {"intent": intent}
    # the program's tokens: generated tokens kept, text between calls tokenized on its own (`programs/track.py`)
    ids = ctx_ids + tok(intent, add_special_tokens=False)["input_ids"]
    pending = "\n" + ("Apology: " if intent == "complaint" else "Answer: ")
    for name, after in (("first", "\nNext step: "), ("next", "")):
        ids = ids + tok(pending, add_special_tokens=False)["input_ids"]
        out = type(model).generate(model, torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=16, do_sample=False, stop_strings=["\n"], tokenizer=tok,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        kept = [t for t in out[0, len(ids):].tolist() if t != tok.eos_token_id]
        value = tok.decode(kept).split("\n")[0]
        while kept and not value.startswith(tok.decode(kept)):
            kept.pop()
        fields[name] = value
        ids = ids + kept
        pending = value[len(tok.decode(kept)):] + after
    return fields


def bench_flows(model, tok, n: int) -> tuple[list[list], dict]:
    engine = engine_of(model)
    items = tickets(n)
    flow.run_batch(model, tok, [{"ticket": t} for t in items[:4]])  # warm-up
    engine.reset_prefix_cache()
    prompt, cached = engine.metrics.num_prompt_tokens, engine.metrics.num_prompt_tokens_cached
    start = time.perf_counter()
    states = flow.run_batch(model, tok, [{"ticket": t} for t in items])
    batch_s = time.perf_counter() - start
    hit_rate = (engine.metrics.num_prompt_tokens_cached - cached) / max(1, engine.metrics.num_prompt_tokens - prompt)
    stock_flow(model, tok, items[0])  # warm-up
    start = time.perf_counter()
    stock = [stock_flow(model, tok, t) for t in items]
    stock_s = time.perf_counter() - start
    same = sum(all(state[k] == ref[k] for k in ref) for state, ref in zip(states, stock))
    rows = [["run_batch", n, batch_s, n / batch_s, f"{hit_rate:.1%}", f"{same}/{n}"],
            ["stock, one by one", n, stock_s, n / stock_s, "-", "-"]]
    return rows, {"speedup": stock_s / batch_s, "hit_rate": hit_rate, "same": same}


# -- 3. select against brute force ----------------------------------------------------------------------------
WORDS = ["yes", "no", "maybe", "billing", "the cat", "a refund", "tomorrow", "x", "42", "def f():", "import os",
         "return None", "complaint", "other", "zebra", " spaced", "JSON", "{", "}"]


@hp.program
def pick(s, context, choices):
    s += context + hp.select("pick", choices)


def bench_select(model, tok, n: int) -> list[list]:
    g = torch.Generator().manual_seed(0)
    cases = []
    for _ in range(n):
        words = [WORDS[i] for i in torch.randint(0, len(WORDS), (int(torch.randint(1, 40, (1,), generator=g)),),
                                                  generator=g).tolist()]
        k = int(torch.randint(2, 6, (1,), generator=g))
        choices = list(dict.fromkeys(WORDS[i] for i in torch.randperm(len(WORDS), generator=g)[:k].tolist()))
        cases.append({"context": " ".join(words) + ": ", "choices": choices})
    states = pick.run_batch(model, tok, cases)
    worst, agree = 0.0, 0
    for case, state in zip(cases, states):
        ctx = tok(case["context"])["input_ids"]
        ref = {}
        for choice in case["choices"]:
            ids = tok(choice, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([ctx + ids[:-1]])).logits[0].float()
            rows = torch.log_softmax(logits, -1)[len(ctx) - 1:]
            ref[choice] = rows.gather(1, torch.tensor(ids)[:, None]).sum().item()
        scores = state.calls[0].scores
        worst = max(worst, *(abs(scores[c] - ref[c]) for c in ref))
        agree += state["pick"] == max(case["choices"], key=ref.get)
    return [[n, f"{worst:.2e}", f"{agree}/{n}"]]


# -- 4. token healing -----------------------------------------------------------------------------------------
@hp.program
def answer(s, ticket, ending, heal):
    s += SYSTEM + "Ticket: " + ticket + ending + hp.gen("a", max_tokens=8, heal=heal)


def bench_healing(model, tok, n: int) -> list[list]:
    """Free fields after text ending in a space, a colon or a quote, with and without healing (greedy)."""
    rows = []
    for ending in ("\nAnswer: ", "\nAnswer:", '\nAnswer: "'):
        items = [{"ticket": t, "ending": ending} for t in tickets(n)]
        plain = answer.run_batch(model, tok, [dict(item, heal=False) for item in items])
        healed = answer.run_batch(model, tok, [dict(item, heal=True) for item in items])
        prompt = tok(SYSTEM + "Ticket: " + items[0]["ticket"] + ending)["input_ids"]
        last = prompt[-1]
        extensions = sum(tok.decode([i]).startswith(tok.decode([last])) for i in range(len(tok))) - 1
        merged = sum(h.token_ids[len(tok(SYSTEM + "Ticket: " + item["ticket"] + ending)["input_ids"]) - 1] != last
                     for h, item in zip(healed, items))
        differ = sum(p["a"] != h["a"] for p, h in zip(plain, healed))
        rows.append([repr(ending), repr(tok.decode([last])), extensions, f"{merged}/{n}", f"{differ}/{n}"])
    return rows


def _median(results: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in results) if isinstance(results[0][k], int | float)
            and not isinstance(results[0][k], bool) else results[-1][k] for k in results[0]}


# -- 5. over HTTP ---------------------------------------------------------------------------------------------
class _Server:
    """`hf-paged serve` (uvicorn) on 127.0.0.1, an ephemeral port, in a thread of this process."""

    def __init__(self, app) -> None:
        import socket
        import threading

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()


def bench_http(model, tok, served, repeats: int, n_flows: int) -> list[list]:
    from hf_paged import Engine
    from hf_paged.serving import ServerSettings, build_app

    local = engine_of(model)
    engine = Engine(served, local.config)
    rows = []
    with _Server(build_app(engine, tok, ServerSettings(model_name="bench"))) as url:
        backend = hp.HTTPBackend(hp.remote(url), tok)
        sides = {"in process": (model, local), "HTTP": (backend, engine)}
        for mode in ("item_by_item", "one_shot"):
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            for i in range(repeats + 1):  # the first round warms up (indexes compiled), interleaved after
                for side, (target, eng) in sides.items():
                    result = run_fill(target, tok, mode, engine=eng)
                    if i:
                        runs[side].append(result)
            base = _median(runs["in process"])
            for side in sides:
                m = _median(runs[side])
                rows.append([f"record, {mode}", side, m["prompt"], m["cached"], m["computed"], m["wall"], m["cpu"],
                             "yes" if m["fields"] == base["fields"] else "NO"])
        items = [{"ticket": t} for t in tickets(n_flows)]
        states = {}
        for side, (target, eng) in sides.items():
            flow.run_batch(target, tok, items[:4])  # warm-up
            eng.reset_prefix_cache()
            computed = eng.metrics.num_computed_tokens
            wall, cpu = time.perf_counter(), time.process_time()
            states[side] = flow.run_batch(target, tok, items)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            computed = eng.metrics.num_computed_tokens - computed
            total = hp.TokenCounts()
            for state in states[side]:
                total.add(state.tokens())
            same = sum(a.fields == b.fields for a, b in zip(states["in process"], states[side]))
            rows.append([f"{n_flows} dialog flows (run_batch)", side, total.prefilled, total.cached,
                         computed, wall, cpu, f"{same}/{n_flows}"])
    return rows


# -- models and main ------------------------------------------------------------------------------------------
def load_models(args) -> list[tuple[str, object, object, object]]:
    """(name, model (wrapped), tokenizer, an unwrapped copy of the weights for the server or None)."""
    model, tok = hf_paged.default_model()
    found = [("embedded 2.3M byte-level Llama", model, tok)]
    if args.llama55m:
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        gpt2 = AutoTokenizer.from_pretrained(args.gpt2)
        torch.manual_seed(0)
        big = LlamaForCausalLM(LlamaConfig(vocab_size=len(gpt2), hidden_size=384, intermediate_size=1024,
                                           num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                                           max_position_embeddings=2048, eos_token_id=gpt2.eos_token_id,
                                           bos_token_id=gpt2.eos_token_id)).eval()
        big.generation_config.eos_token_id = gpt2.eos_token_id
        size = sum(p.numel() for p in big.parameters()) / 1e6
        found.append((f"random {size:.0f}M Llama, GPT-2 tokenizer", big, gpt2))
    copies = [copy.deepcopy(model) if args.http else None for _, model, _ in found]
    for _, model, _ in found:
        hf_paged.wrap(model)
    return [(name, model, tok, served) for (name, model, tok), served in zip(found, copies)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flows", type=int, default=64)
    parser.add_argument("--select-cases", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--block-sizes", default="16,4", help="block sizes of the record table (the first: the rest)")
    parser.add_argument("--llama55m", action="store_true")
    parser.add_argument("--gpt2", default="/work/shared/data/tokenizers/gpt2")
    parser.add_argument("--http", action="store_true", help="section 5: in process vs over HTTP")
    parser.add_argument("--only-http", action="store_true", help="section 5 only")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.http = args.http or args.only_http
    torch.set_num_threads(args.threads)
    header = (f"# Structured programs (issue 40)\n\nMachine: {machine()}\n\nCommand: `python benchmarks/programs.py "
              f"{' '.join(sys.argv[1:])}`\n")
    sections = [header]
    block_sizes = [int(b) for b in args.block_sizes.split(",")]
    for name, model, tok, served in load_models(args):
        sections.append(f"\n## {name}\n")
        if args.only_http:
            hf_paged.unwrap(model)
            hf_paged.wrap(model, block_size=block_sizes[0])
            sections.append(_http_table(name, model, tok, served, args))
            continue
        for block_size in block_sizes[1:] + block_sizes[:1]:  # the first (the default) last: flows run on it
            hf_paged.unwrap(model)
            hf_paged.wrap(model, block_size=block_size)
            rows, medians = bench_record(model, tok, args.repeats)
            sections.append(print_table(
                ["6-field record", "prompt tokens computed", "vs one_shot", "all tokens computed", "vs one_shot",
                 "forward passes", "wall s", "CPU s", "valid JSON"], rows,
                title=f"\n1. {name}: one record, block_size {block_size}, median of {args.repeats}"))
        sections.append("\nitem_by_item text: `" + medians["item_by_item"]["text"] + "`\n\none_shot text: `"
                        + medians["one_shot"]["text"] + "`\n")
        rows, flows = bench_flows(model, tok, args.flows)
        sections.append(print_table(["dialog flows", "flows", "seconds", "flows/s", "prefix hit rate",
                                     "same fields as stock"], rows,
                                    title=f"\n2. {name}: {args.flows} flows, speedup {flows['speedup']:.1f}x"))
        sections.append(print_table(["select cases", "largest |logprob - stock|", "same pick as stock"],
                                    bench_select(model, tok, args.select_cases), title=f"\n3. {name}: select"))
        sections.append(print_table(["text before the field", "its last token", "tokens that extend it",
                                     "healed first token merged", "fields that differ"],
                                    bench_healing(model, tok, args.flows // 2),
                                    title=f"\n4. {name}: token healing, {args.flows // 2} fields each"))
        if args.http:
            sections.append(_http_table(name, model, tok, served, args))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(sections) + "\n")



def _http_table(name, model, tok, served, args) -> str:
    block_size = engine_of(model).config.block_size
    return print_table(["run", "backend", "prompt tokens prefilled", "prompt tokens from cache",
                        "all tokens computed", "wall s", "CPU s", "same fields as in process"],
                       bench_http(model, tok, served, args.repeats, args.flows),
                       title=f"\n5. {name}: in process vs over HTTP, block_size {block_size}, median of {args.repeats}")


if __name__ == "__main__":
    main()
