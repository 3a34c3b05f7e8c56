"""Process-wide memos stay bounded over a long life, and a recycled `id()` never hands out another tokenizer's index.

A server builds processors for tens of thousands of requests; each new tokenizer object, EOS choice or vocabulary
must not leave an entry behind for ever (benchmarks/soak_memory.py measures the process over thousands of calls).
"""

from __future__ import annotations

import gc
import os

import pytest
from transformers import PreTrainedTokenizerFast

from hf_paged.processors import RegexLogitsProcessor
from hf_paged.processors.index import shared_trie, vocabulary
from hf_paged.processors.index.index_cache import IndexCache, index_key
from hf_paged.processors.index.shared_trie import token_trie
from hf_paged.processors.index.vocabulary import build_vocabulary
from tests.processors.toy_tokenizers import byte_level_bpe


def _byte_tokenizer(merges: list[tuple[str, str]] = ()) -> PreTrainedTokenizerFast:
    """A new byte-level tokenizer object each call; each merge adds one token (so `merges` picks the vocabulary)."""
    return PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(merges), eos_token="<eos>")


@pytest.fixture()
def fresh_memos(monkeypatch):
    """Empty memos for the test (the module's own are restored after it)."""
    monkeypatch.setattr(vocabulary, "_BY_FINGERPRINT", type(vocabulary._BY_FINGERPRINT)())
    monkeypatch.setattr(vocabulary, "_BY_TOKENIZER", type(vocabulary._BY_TOKENIZER)())
    monkeypatch.setattr(shared_trie, "_BY_FINGERPRINT", type(shared_trie._BY_FINGERPRINT)())


def test_a_recycled_tokenizer_id_gets_its_own_vocabulary(monkeypatch, fresh_memos):
    """Two tokenizers at the same address one after the other (forced: every object's `id()` is 7 in the module):
    the second, with another vocabulary, must get its own vocabulary and masks, never the first one's."""
    monkeypatch.setattr(vocabulary, "id", lambda obj: 7, raising=False)
    first = _byte_tokenizer()
    old = build_vocabulary(first)
    del first
    gc.collect()
    second = _byte_tokenizer([("a", "b")])
    new = build_vocabulary(second)
    assert new.fingerprint != old.fingerprint
    assert new.num_tokens == old.num_tokens + 1 and b"ab" in new.tokens
    proc = RegexLogitsProcessor("ab", second, index_cache=IndexCache(max_entries=2))
    assert proc.vocab is new
    ab = second.convert_tokens_to_ids("ab")
    assert proc.compiled.mask(proc.compiled.index.get_initial_state()).num_allowed == 2  # "a" and "ab"
    assert proc.compiled.index.get_next_state(proc.compiled.index.get_initial_state(), ab) is not None


def test_new_tokenizer_objects_leave_at_most_max_tokenizers_entries(fresh_memos):
    kept = []  # live tokenizers (dead ones are dropped first, so keep them alive to reach the cap)
    for _ in range(vocabulary.MAX_TOKENIZERS + 10):
        kept.append(_byte_tokenizer())
        build_vocabulary(kept[-1])
    assert len(vocabulary._BY_TOKENIZER) == vocabulary.MAX_TOKENIZERS
    assert len(vocabulary._BY_FINGERPRINT) == 1  # one vocabulary, shared by all of them
    assert build_vocabulary(kept[-1]) is build_vocabulary(kept[-2])


def test_collected_tokenizers_are_dropped_before_live_ones(fresh_memos, monkeypatch):
    monkeypatch.setattr(vocabulary, "MAX_TOKENIZERS", 4)  # (a full collection per tokenizer: a few, not 69)
    live = _byte_tokenizer()
    build_vocabulary(live)
    for _ in range(vocabulary.MAX_TOKENIZERS + 5):
        build_vocabulary(_byte_tokenizer())  # collected right after
        gc.collect()
    assert len(vocabulary._BY_TOKENIZER) <= vocabulary.MAX_TOKENIZERS
    assert (id(live), None) in vocabulary._BY_TOKENIZER  # the oldest entry, but its tokenizer lives: kept


def test_distinct_vocabularies_leave_at_most_max_vocabularies(fresh_memos):
    letters = "abcdefghijklmnop"
    tokenizers = [_byte_tokenizer([(letters[i], letters[i + 1])]) for i in range(vocabulary.MAX_VOCABULARIES + 3)]
    vocabs = [build_vocabulary(tok) for tok in tokenizers]
    tries = [token_trie(v) for v in vocabs]
    assert len({v.fingerprint for v in vocabs}) == len(tokenizers)
    assert len(vocabulary._BY_FINGERPRINT) == vocabulary.MAX_VOCABULARIES
    assert len(shared_trie._BY_FINGERPRINT) == vocabulary.MAX_VOCABULARIES
    assert vocabs[-1].fingerprint in vocabulary._BY_FINGERPRINT and vocabs[0].fingerprint not in vocabulary._BY_FINGERPRINT
    # the most recent is shared; an evicted one is read again, the same content under the same fingerprint
    assert build_vocabulary(tokenizers[-1]) is vocabs[-1] and token_trie(vocabs[-1]) is tries[-1]
    again = build_vocabulary(tokenizers[0])
    assert again is not vocabs[0] and again.fingerprint == vocabs[0].fingerprint and again.tokens == vocabs[0].tokens


def test_a_used_vocabulary_stays_while_others_come_and_go(fresh_memos):
    keep = _byte_tokenizer()
    kept = build_vocabulary(keep)
    letters = "abcdefghijklmnop"
    for i in range(vocabulary.MAX_VOCABULARIES + 3):
        build_vocabulary(_byte_tokenizer([(letters[i], letters[i + 1])]))
        assert build_vocabulary(keep) is kept  # each use moves it to the recent end


def _index_files(directory) -> dict[str, int]:
    return {name: os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
            if name.endswith(".index")}


def test_index_files_on_disk_stay_under_max_disk_bytes(tmp_path):
    """A new regex per request must not fill the disk: the least recently used files go past the cap."""
    vocab = build_vocabulary(_byte_tokenizer())
    probe = IndexCache(cache_dir=tmp_path / "probe")
    probe.get_or_compile(index_key("regex", "x[0-9]{3}", None, vocab.fingerprint), "x[0-9]{3}", vocab)
    one_file = max(_index_files(tmp_path / "probe").values())
    cap = 4 * one_file
    cache = IndexCache(max_entries=2, cache_dir=tmp_path / "tier", max_disk_bytes=cap)
    keys = []
    for i in range(20):
        regex = f"{'y' * (i % 3)}x{i}[0-9]{{3}}"
        keys.append(index_key("regex", regex, None, vocab.fingerprint))
        cache.get_or_compile(keys[-1], regex, vocab)
        files = _index_files(tmp_path / "tier")
        assert sum(files.values()) <= cap, (i, files)
    assert f"{keys[-1]}.index" in files  # the newest stays
    assert len(files) < 20
    unbounded = IndexCache(cache_dir=tmp_path / "all", max_disk_bytes=None)
    for i in range(6):
        unbounded.get_or_compile(index_key("regex", f"z{i}", None, vocab.fingerprint), f"z{i}", vocab)
    assert len(_index_files(tmp_path / "all")) == 6


def test_a_touched_file_outlives_older_ones(tmp_path):
    vocab = build_vocabulary(_byte_tokenizer())
    regexes = [f"w{i}[0-9]{{3}}" for i in range(3)]
    keys = [index_key("regex", r, None, vocab.fingerprint) for r in regexes]
    writer = IndexCache(cache_dir=tmp_path, max_disk_bytes=None)
    for key, regex in zip(keys, regexes):
        writer.get_or_compile(key, regex, vocab)
    for offset, key in enumerate(keys):  # saved in order, a second apart
        os.utime(tmp_path / f"{key}.index", (1_000_000 + offset, 1_000_000 + offset))
    assert IndexCache(cache_dir=tmp_path).get_or_compile(keys[0], regexes[0], vocab).from_disk  # touched: newest
    sizes = _index_files(tmp_path)
    cache = IndexCache(cache_dir=tmp_path, max_disk_bytes=sum(sizes.values()))
    fourth = "w3[0-9]{3}"
    cache.get_or_compile(index_key("regex", fourth, None, vocab.fingerprint), fourth, vocab)
    left = _index_files(tmp_path)
    assert f"{keys[1]}.index" not in left  # the least recently used went first
    assert f"{keys[0]}.index" in left and sum(left.values()) <= sum(sizes.values())


def test_one_character_nodes_are_memoised_up_to_a_cap(monkeypatch):
    """Regexes over many distinct characters (CJK enum values, say) keep at most `_CHARS_SIZE` shared nodes."""
    from hf_paged.processors.automaton import syntax

    monkeypatch.setattr(syntax, "_CHARS", {})
    monkeypatch.setattr(syntax, "_CHARS_SIZE", 64)
    first = [syntax.parse(chr(cp) + "x") for cp in range(0x4E00, 0x4E00 + 200)]
    assert len(syntax._CHARS) == 64
    again = [syntax.parse(chr(cp) + "x") for cp in range(0x4E00, 0x4E00 + 200)]
    assert again == first  # a node built past the cap equals the memoised one
