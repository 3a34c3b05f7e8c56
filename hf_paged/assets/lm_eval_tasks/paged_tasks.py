"""Local lm-evaluation-harness tasks for hf_paged's tests, benchmark and README (no hub): documents built from a
seeded word list, so every machine gets the same ones. `hf-paged eval` adds this folder to `--include_path`.

    hf_paged_gen   generate_until          two short few-shot examples (the first two documents, the same before
                                           every prompt), then a passage and a question of 50-1,500 tokens; the
                                           answer is one word, up to 128 new tokens
    hf_paged_mc    multiple_choice         a 300-800-token passage, 4 choices of 10-40 tokens
    hf_paged_ppl   loglikelihood_rolling   passages of 1,000-6,000 characters (several windows each on short models)

Lengths are in the tokens of the model's own tokenizer: lm-eval hands a task's loader its `--model_args` (and
`--metadata`), and the loader reads `pretrained`'s tokenizer for its tokens per word of `WORDS` (the embedded
model's byte-level tokenizer: ~7; GPT-2's: ~1). Without one (a `TaskManager` given no metadata, as the tests'), it
takes the embedded model's 7. (Until 2026-12-05 lengths were characters: right for the embedded model, 5-7x too
short for a BPE vocabulary: prompts of 184-246 GPT-2 tokens.)
"""
from __future__ import annotations

import random

WORDS = ["river", "stone", "light", "paper", "garden", "window", "market", "silver", "winter", "orange", "signal", "harbor", "forest", "engine", "letter", "bridge", "candle", "thunder", "meadow", "pocket", "violin", "rocket", "planet", "basket", "ladder", "mirror", "castle", "feather", "tunnel", "lantern", "compass", "anchor", "blanket", "carpet", "cotton", "desert", "island", "jungle", "kettle", "lemon", "marble", "needle", "ocean", "pepper", "quartz", "saddle", "temple", "valley", "wagon", "yellow", "zipper"]


def _passage(rng: random.Random, num_chars: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < num_chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)


_BYTE_LEVEL_WORD = 7.0  # tokens a word of `WORDS` takes on the embedded model's byte-level tokenizer (6.96)


def _tokens_per_word(pretrained, tokenizer=None) -> float:
    """How many tokens a word of `WORDS` takes (with its space) on the tokenizer of `--model_args` (`tokenizer`, else
    `pretrained`: a local path or hub id); anything else (none, a loaded model, a tokenizer that does not load)
    takes the embedded model's: the documents' sizes are all that depends on it."""
    name = tokenizer if isinstance(tokenizer, str) else pretrained
    if not isinstance(name, str):
        return _BYTE_LEVEL_WORD
    from transformers import AutoTokenizer

    try:
        loaded = AutoTokenizer.from_pretrained(name)
    except Exception:  # noqa: BLE001 -- the model's own loading reports a bad path; here only sizes depend on it
        return _BYTE_LEVEL_WORD
    counts = [len(loaded(" " + word, add_special_tokens=False)["input_ids"]) for word in WORDS]
    return sum(counts) / len(counts)


def _words(rng: random.Random, tokens: int, per_word: float) -> str:
    """About `tokens` tokens of words drawn from `WORDS` (at least one word)."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, round(tokens / per_word))))


def _dataset(docs: list[dict]):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def load_gen(num_docs: int = 48, seed: int = 0, pretrained=None, tokenizer=None, **_):
    per_word = _tokens_per_word(pretrained, tokenizer)
    rng = random.Random(seed)
    docs = []
    for i in range(num_docs):
        # the first two are the few-shot examples before every prompt (`first_n`): short; the rest's passage and
        # question (the question ~10 tokens on a BPE vocabulary, ~35 byte-level) are 50-1,500 tokens
        tokens = 8 * per_word if i < 2 else rng.randint(50, 1_500) - max(10.0, 5 * per_word)
        passage = _words(rng, tokens, per_word)
        k = rng.randint(1, min(5, len(passage.split())))
        docs.append({"passage": passage, "k": k, "answer": passage.split()[k - 1]})
    return _dataset(docs)


def load_mc(num_docs: int = 48, seed: int = 1, pretrained=None, tokenizer=None, **_):
    per_word = _tokens_per_word(pretrained, tokenizer)
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        passage = _words(rng, rng.randint(300, 800), per_word)
        choices = [_words(rng, rng.randint(10, 40), per_word) for _ in range(4)]
        docs.append({"passage": passage, "choices": choices, "gold": rng.randrange(4)})
    return _dataset(docs)


def load_ppl(num_docs: int = 12, seed: int = 2, **_):
    rng = random.Random(seed)
    return _dataset([{"text": _passage(rng, rng.randint(1000, 6000))} for _ in range(num_docs)])
