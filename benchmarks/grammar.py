"""Lark-grammar constrained decoding benchmark (`GrammarLogitsProcessor`), GPT-2's 50,257-token vocabulary.

For each grammar of `tests/processors/lark_grammars.py` (arithmetic with left recursion, a SQL SELECT subset, a small
Python-like statement language, JSON in Lark syntax):
  1. compile, cold (a fresh `IndexCache`; no grammar's automata are memoised by an earlier one): the Lark front end
     (`compile_lark`: parse, left recursion, rule texts) and the whole processor (front end + rule automata + the
     lazy token index with its initial mask and warm-up), CPU time of the process (`time.process_time`);
  2. mask time per token along `--sentences` sentences derived at random from the grammar and tokenized by GPT-2:
     one `process_rows` call per token (advance over the last token, the state's mask, applied to a [1, 50257] fp32
     row), first pass (the memo starts empty: first visits included) and second pass (every mask memoised). The
     walk's processor takes `max_ignored=None` (Lark's "any number of ignored matches", the language the sentences
     are derived from): the default, 1 since 287e535, refuses their whitespace runs, and the walk would time the
     ended state's masks from there on; every walked token is checked allowed (outside the clock);
  (`HF_PAGED_JIT=now` unless set: the compiled walks are loaded first, so no background load shares the clock.)
  3. end to end: a tiny random GPT-2 (n_layer=2, n_embd=64) samples `--rows` outputs in stock `model.generate`
     with EOS raised by `--eos-bias` and tokens without letters or digits by `--punct-bias` (a random model
     otherwise seldom ends an identifier among 50k tokens, or a document); every output that ended with EOS must
     parse with Lark's Earley parser (`lexer="dynamic_complete"`).

Usage:
    python benchmarks/grammar.py                      # prints the tables and the machine
    python benchmarks/grammar.py --rows 32 --sentences 40 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_PAGED_JIT", "now")  # steady state: the compiled mask walks, loaded before any timing

from benchmarks.common import machine, print_table
from hf_paged.processors import GrammarLogitsProcessor, IndexCache
from hf_paged.processors.lark.compile import compile_lark
from tests.processors.lark_grammars import GRAMMARS, Sentences, lark_accepts, lark_parser

GPT2_DIR = os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers", "gpt2")


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def compile_times(grammar: str, tok) -> tuple[float, float, GrammarLogitsProcessor]:
    """(front end CPU s, whole compile CPU s, the processor)."""
    start = time.process_time()
    compile_lark(grammar)
    front = time.process_time() - start
    start = time.process_time()
    proc = GrammarLogitsProcessor(grammar, tok, index_cache=IndexCache(max_entries=2))
    proc.compiled  # noqa: B018 -- waits for the background build
    return front, time.process_time() - start, proc


def walk_processor(grammar: str, tok) -> GrammarLogitsProcessor:
    """The processor `mask_times` walks: the sentences' language (`Sentences` inserts ignored text at random, runs
    of any length), so any number of `%ignore` matches between tokens."""
    proc = GrammarLogitsProcessor(grammar, tok, index_cache=IndexCache(max_entries=2), max_ignored=None)
    proc.compiled  # noqa: B018 -- waits for the background build
    return proc


def mask_times(proc: GrammarLogitsProcessor, tok, grammar: str, num_sentences: int) -> tuple[list, list, int]:
    """Per-token CPU seconds of `process_rows`, first pass and memoised pass; and the tokens walked. Raises where
    the processor refuses a token of a derived sentence (the walk would go on timing an ended row)."""
    derived = Sentences(grammar, seed=11)
    sentences = [tok(derived.sentence(), add_special_tokens=False)["input_ids"] for _ in range(num_sentences)]
    scores = torch.zeros(1, proc.vocab.vocab_size)
    passes: list[list[float]] = [[], []]
    for times in passes:
        for n, ids in enumerate(sentences):
            rid = f"s{n}"
            for i in range(len(ids) + 1):
                scores.zero_()
                start = time.process_time()
                proc.process_rows([rid], [ids[:i]], scores)
                times.append(time.process_time() - start)
                if i < len(ids) and scores[0, ids[i]] == float("-inf"):
                    raise RuntimeError(f"the processor refuses token {i} ({tok.decode(ids[i:i + 1])!r}) of the "
                                       f"derived sentence {tok.decode(ids)!r}: the walk would time an ended row")
            proc.release(rid)
    return passes[0], passes[1], sum(map(len, sentences))


class Bias:
    """Adds a fixed bias per token (EOS, punctuation) before the grammar's mask: a random model otherwise seldom ends
    an identifier or a document among 50k tokens."""

    def __init__(self, bias: torch.Tensor) -> None:
        self.bias = bias

    def __call__(self, input_ids, scores):
        scores[:, : self.bias.shape[0]] += self.bias
        return scores


def sampled(proc: GrammarLogitsProcessor, tok, grammar: str, args) -> tuple[int, int, int]:
    """(finished outputs, of which Lark parses, rows)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessorList

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=2, n_embd=64, n_head=2, n_positions=512,
                                       eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)).eval()
    bias = torch.tensor([0.0 if any(c.isalnum() for c in tok.decode([t])) else args.punct_bias
                         for t in range(len(tok))])
    bias[tok.eos_token_id] = args.eos_bias
    parser = lark_parser(grammar)
    prompt = torch.tensor([tok("Output:")["input_ids"]] * args.rows)
    finished = parsed = 0
    for seed in range(2):
        torch.manual_seed(seed)
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                             max_new_tokens=args.max_new_tokens, pad_token_id=tok.eos_token_id,
                             logits_processor=LogitsProcessorList([Bias(bias), proc]))
        for row in out[:, prompt.shape[1]:].tolist():
            if tok.eos_token_id in row:
                finished += 1
                parsed += lark_accepts(parser, tok.decode(row[: row.index(tok.eos_token_id)]))
    return finished, parsed, 2 * args.rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=30)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--eos-bias", type=float, default=8.0)
    parser.add_argument("--punct-bias", type=float, default=4.0, help="added to tokens without letters or digits")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(GPT2_DIR)
    torch.set_num_threads(min(torch.get_num_threads(), 2))
    start = time.process_time()  # the vocabulary and its trie: once per tokenizer, before any grammar
    GrammarLogitsProcessor('start: "x"', tok).compiled  # noqa: B018
    vocabulary_ms = (time.process_time() - start) * 1e3
    compile_rows, mask_rows, gen_rows = [], [], []
    for name, grammar in GRAMMARS.items():
        front, whole, proc = compile_times(grammar, tok)
        num_rules = len(proc.compiled_grammar.rule_names) - 1
        compile_rows.append([name, num_rules, f"{front * 1e3:.1f}", f"{whole * 1e3:.1f}"])
        first, memo, num_tokens = mask_times(walk_processor(grammar, tok), tok, grammar, args.sentences)
        mask_rows.append([name, num_tokens, f"{np.mean(first) * 1e6:.0f}", f"{_pct(first, 50) * 1e6:.0f}",
                          f"{_pct(first, 99) * 1e6:.0f}", f"{np.mean(memo) * 1e6:.0f}", f"{_pct(memo, 50) * 1e6:.0f}",
                          f"{_pct(memo, 99) * 1e6:.0f}"])
        finished, ok, rows = sampled(proc, tok, grammar, args)
        gen_rows.append([name, rows, finished, f"{ok}/{finished}"])
    print_table(["grammar", "called rules", "front end CPU ms", "compile CPU ms (cold, all)"], compile_rows,
                f"Compile (GPT-2 vocabulary; built once per tokenizer before: {vocabulary_ms:.0f} ms CPU)")
    print()
    print_table(["grammar", "tokens", "first pass mean us", "p50", "p99", "memoised mean us", "p50", "p99"],
                mask_rows, "Mask per token (`process_rows`: advance + mask + apply, one [1, 50257] row)")
    print()
    print_table(["grammar", "rows sampled", "ended with EOS", "parse with Lark"], gen_rows,
                f"Sampled outputs (tiny random GPT-2, max_new_tokens={args.max_new_tokens}, EOS bias {args.eos_bias}, "
                f"punctuation bias {args.punct_bias})")
    print()
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
