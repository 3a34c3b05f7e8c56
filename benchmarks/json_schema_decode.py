"""Token masks right after a compile, the way the processors get them: each MaskBench schema compiled through an
`IndexCache` (whose background thread prepares a grammar's per-rule facts once the index is published), then its
valid instances walked token by token, timing each mask on the decoding thread (`time.thread_time`: the
background thread's work is not the decoding thread's latency). First visits of a state (mask computed) apart.

The companion of `json_schema_wide.py`: what moving work off the compile's path costs decoding.

    python benchmarks/json_schema_decode.py [--schemas DIR] [--limit N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import schema_sets
from benchmarks.json_schema import DEFAULT_SHARED, _texts, machine


def _compile(cache, schema, vocab, number: int):
    from hf_paged.processors.automaton import check_automaton
    from hf_paged.processors.budget import CompileBudget
    from hf_paged.processors.index.index_cache import index_key
    from hf_paged.processors.json_schema import load_schema
    from hf_paged.processors.schema.ladder import schema_to_grammar

    budget = CompileBudget()
    loaded = load_schema(schema, budget)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        regex = schema_to_grammar(loaded, budget=budget)
    check_automaton(regex, budget.for_automaton())
    return cache.get_or_compile(index_key("decode-bench", regex, None, vocab.fingerprint, number), regex, vocab)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", default=os.path.join(DEFAULT_SHARED, "schemas"))
    parser.add_argument("--tokenizer", default=os.path.join(DEFAULT_SHARED, "tokenizers", "gpt2"))
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from hf_paged.errors import SchemaError
    from hf_paged.processors import jit
    from hf_paged.processors.index.index_cache import IndexCache
    from hf_paged.processors.index.shared_trie import token_trie
    from hf_paged.processors.index.vocabulary import build_vocabulary

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = build_vocabulary(tok)
    token_trie(vocab)
    jit.wait()
    cache = IndexCache(max_entries=4)
    _compile(cache, {"type": "object", "properties": {"a": {"type": "string"}}}, vocab, -1)
    first, every, compiles = [], [], []
    for number, (_, schema, tests) in enumerate(schema_sets.maskbench(args.schemas)[: args.limit]):
        start = time.perf_counter()
        try:
            compiled = _compile(cache, schema, vocab, number)
        except SchemaError:  # (refused: no masks to time)
            continue
        compiles.append(time.perf_counter() - start)
        for valid, text in _texts(schema, tests):
            if not valid or text is None:
                continue
            state = compiled.index.get_initial_state()
            for token in [*tok.encode(text), None]:
                new = compiled.state_mask(state) is None
                start = time.thread_time()
                compiled.mask(state)
                spent = (time.thread_time() - start) * 1e6
                every.append(spent)
                if new:
                    first.append(spent)
                if token is None:
                    break
                state = compiled.index.get_next_state(state, token)
                if state is None:
                    break
    pct = np.percentile
    print(f"{machine()}\n{len(compiles)} schemas compiled (wall, waiting on the cache: {sum(compiles) * 1e3:.0f} ms "
          f"summed); {len(every)} masks, {len(first)} first visits: first-visit CPU us p50 {pct(first, 50):.0f}, "
          f"p99 {pct(first, 99):.0f}, max {max(first):.0f}; every mask p99 {pct(every, 99):.0f}; masks summed "
          f"{sum(every) / 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
