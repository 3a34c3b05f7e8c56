"""Local lm-evaluation-harness tasks for hf_paged's tests, benchmark and README (no hub): documents built from a
seeded word list, so every machine gets the same ones. `hf-paged eval` adds this folder to `--include_path`.

    hf_paged_gen   generate_until          a passage of 40-480 characters (50-1,500 tokens after the few-shot examples:
                                           the first documents, the same before every one), a question, one word
    hf_paged_mc    multiple_choice         a 300-800-token passage, 4 choices of 10-40 tokens
    hf_paged_ppl   loglikelihood_rolling   passages of 1,000-6,000 tokens (several windows each on short models)
"""

from __future__ import annotations

import random

WORDS = ["river", "stone", "light", "paper", "garden", "window", "market", "silver", "winter", "orange", "signal", "harbor", "forest", "engine", "letter", "bridge", "candle", "thunder", "meadow", "pocket", "violin", "rocket", "planet", "basket", "ladder", "mirror", "castle", "feather", "tunnel", "lantern", "compass", "anchor", "blanket", "carpet", "cotton", "desert", "island", "jungle", "kettle", "lemon", "marble", "needle", "ocean", "pepper", "quartz", "saddle", "temple", "valley", "wagon", "yellow", "zipper"]


def _passage(rng: random.Random, num_chars: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < num_chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def _dataset(docs: list[dict]):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def load_gen(num_docs: int = 48, seed: int = 0, **_):
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        passage = _passage(rng, rng.randint(40, 480))
        k = rng.randint(1, 5)
        docs.append({"passage": passage, "k": k, "answer": passage.split()[k - 1]})
    return _dataset(docs)


def load_mc(num_docs: int = 48, seed: int = 1, **_):
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        passage = _passage(rng, rng.randint(300, 800))
        choices = [_passage(rng, rng.randint(10, 40)) for _ in range(4)]
        docs.append({"passage": passage, "choices": choices, "gold": rng.randrange(4)})
    return _dataset(docs)


def load_ppl(num_docs: int = 12, seed: int = 2, **_):
    rng = random.Random(seed)
    return _dataset([{"text": _passage(rng, rng.randint(1000, 6000))} for _ in range(num_docs)])
