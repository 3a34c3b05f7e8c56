"""The caches of constrained decoding are bounded in bytes, by the measured sizes of what they hold.

A server meeting a new large schema per user must not keep 64 compiled indexes (tens of MB each with a 50k-token
vocabulary) because the bound was a count: `IndexCache(max_bytes=)` weighs each index (`CompiledIndex.num_bytes`:
its automaton, per-state views and memoised masks, measured), drops the least recently used past the budget, and
counts an index's growth as decoding memoises masks; the server's processor cache weighs processors by the index
they keep alive; the retry path's validator memo keeps nothing alive. A request in flight keeps its index through its
processor: dropping it from a cache never changes what the request decodes. Sizes are counted, never timed.
"""

from __future__ import annotations

import gc
import mmap
import weakref

import numpy as np
import pytest

from hf_paged.batching.retry import Retrier
from hf_paged.batching.sampling import SamplingParams
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.index import index_cache as index_cache_module
from hf_paged.processors.index.byte_lru import ByteLRU
from hf_paged.processors.index.index_cache import IndexCache
from hf_paged.processors.index.sizes import held_bytes
from hf_paged.serving.prepare import ConstraintCache
from tests.processors.toy_tokenizers import byte_level_tokenizer


def schema(num_keys: int) -> dict:
    """Objects of `num_keys` string properties: the index grows with the keys."""
    return {"type": "object", "properties": {f"key{i}": {"type": "string"} for i in range(num_keys)},
            "required": [f"key{i}" for i in range(num_keys)], "additionalProperties": False}


@pytest.fixture()
def no_warm_up(monkeypatch):
    """No background warm-up after a build: an index's size then changes only when the test visits its states."""
    monkeypatch.setattr(index_cache_module, "warm_up", lambda compiled: None)


def compiled_size(num_keys: int) -> int:
    cache = IndexCache(max_bytes=None)
    return JSONSchemaLogitsProcessor(schema(num_keys), byte_level_tokenizer(), index_cache=cache).compiled.num_bytes


def test_held_bytes_counts_each_buffer_once_and_mapped_arrays_by_rows():
    base = np.zeros(1000, dtype=np.int32)
    holder = {"a": base, "view": base[10:20], "again": [base], "raw": b"x" * 100}
    slots = 4 * 16 + 8  # (the dict's four entries, the list's one slot)
    assert held_bytes(holder) == 4000 + 100 + slots
    assert held_bytes(holder, skip=(base,)) == 100 + slots
    mapped = np.frombuffer(mmap.mmap(-1, 1 << 22), dtype=np.int32).reshape(1024, 1024)  # 4 KiB a row
    assert held_bytes((mapped,), mapped_rows=3) == 3 * 4096 + 8
    assert held_bytes((mapped,), mapped_rows=None) == (1 << 22) + 8


def test_held_bytes_reads_dicts_another_thread_fills():
    """`IndexCache.get` measures an index while decoding or the warm-up fills its memo dicts: the walk copies a
    dict's keys and values in one call, so a dict growing meanwhile never raises (here a key whose type check
    grows the dict, deterministically, where a thread switch could)."""
    table: dict = {}

    class Growing:
        @property
        def __class__(self):  # (read by isinstance)
            table[object()] = b"x"
            return Growing

    table[Growing()] = np.zeros(4, dtype=np.int8)
    assert held_bytes({"memo": table}) >= 4


def test_byte_lru_drops_least_recent_never_the_one_in_use():
    dropped = []
    lru: ByteLRU[str] = ByteLRU(None, 100, on_drop=lambda key, value: dropped.append(key))
    lru.put("a", "A", 40)
    lru.put("b", "B", 40)
    lru.get("a")  # a is now the newest
    lru.put("c", "C", 40)
    assert dropped == ["b"] and list(lru) == ["a", "c"] and lru.num_bytes == 80
    lru.resize("c", 500)  # over the whole budget alone: everything else goes, c stays
    assert list(lru) == ["c"] and lru.num_bytes == 500
    with pytest.raises(ValueError, match="max_bytes"):
        ByteLRU(None, 0)


def test_index_cache_keeps_its_measured_bytes_under_max_bytes(no_warm_up):
    tok = byte_level_tokenizer()
    sizes = [compiled_size(n) for n in (4, 5, 6)]
    assert sizes[0] < sizes[1] < sizes[2] and sizes[0] > 10_000  # (measured: automaton rows and views, ~50-80 KB)
    cache = IndexCache(max_bytes=sizes[0] + sizes[1] + sizes[2] // 2)  # room for two, never three
    procs = [JSONSchemaLogitsProcessor(schema(n), tok, index_cache=cache) for n in (4, 5)]
    assert all(proc.compiled is not None for proc in procs)
    assert len(cache) == 2 and cache.num_bytes == sizes[0] + sizes[1]
    assert cache.get(procs[0].index_key) is not None  # the 4-key schema is now the most recently used
    assert JSONSchemaLogitsProcessor(schema(6), tok, index_cache=cache).compiled is not None
    assert cache.get(procs[1].index_key) is None  # the least recently used went
    assert cache.get(procs[0].index_key) is not None
    assert len(cache) == 2 and cache.num_bytes == sizes[0] + sizes[2] <= cache.max_bytes


def test_an_index_growing_under_decoding_pushes_older_ones_out(no_warm_up):
    tok = byte_level_tokenizer()
    small, big = compiled_size(1), compiled_size(6)
    cache = IndexCache(max_bytes=small + big + 40)  # both fit as built; a few masks more do not
    first = JSONSchemaLogitsProcessor(schema(1), tok, index_cache=cache).compiled
    second = JSONSchemaLogitsProcessor(schema(6), tok, index_cache=cache).compiled
    assert len(cache) == 2
    index = second.index
    state = index.get_initial_state()
    for byte in b'{"key0":"':  # visit states: each memoised mask (36 bytes with this vocabulary) is counted
        state = index.get_next_state(state, tok.convert_tokens_to_ids(chr(byte)))
        second.mask(state)
    assert len(cache) == 1 and cache.num_bytes == second.num_bytes <= cache.max_bytes
    assert first.index.on_grow is None  # dropped: its growth is no longer the cache's


def test_a_request_in_flight_keeps_its_index_when_the_cache_drops_it(no_warm_up):
    """Decode half a document, fill the cache with other schemas until the request's index is dropped, decode the
    rest: the same masks as a processor that never lost its index, from the same index object."""
    import torch

    tok = byte_level_tokenizer()
    cache = IndexCache(max_bytes=compiled_size(6))  # room for about one index
    proc = JSONSchemaLogitsProcessor(schema(2), tok, index_cache=cache)
    reference = JSONSchemaLogitsProcessor(schema(2), tok, index_cache=IndexCache(max_bytes=None))
    text = [tok.convert_tokens_to_ids(c) for c in '{"key0":"a","key1":"b"}']
    held = proc.compiled
    ref = weakref.ref(held.index)
    vocab_size = len(tok)

    def masks(processor, upto: int) -> list[list[bool]]:
        out = []
        for n in range(upto):
            scores = torch.zeros(1, vocab_size)
            processor.process_rows(["r"], [text[:n]], scores)
            out.append((scores[0] > -1).tolist())
        return out

    first_half = masks(proc, len(text) // 2)
    for n in (5, 6):
        assert JSONSchemaLogitsProcessor(schema(n), tok, index_cache=cache).compiled is not None
    assert cache.get(proc.index_key) is None and cache.num_bytes <= cache.max_bytes  # dropped by the cache
    assert proc.compiled is held  # ... and still the request's
    assert first_half + masks(proc, len(text))[len(first_half):] == masks(reference, len(text))
    proc.release("r")
    del proc, held
    gc.collect()
    assert ref() is None  # nothing else kept it


def test_the_process_wide_budget_reads_its_environment_variable(monkeypatch):
    monkeypatch.delenv(index_cache_module.MAX_BYTES_ENV, raising=False)
    assert index_cache_module._env_max_bytes() == index_cache_module.DEFAULT_MAX_BYTES == 512 << 20
    monkeypatch.setenv(index_cache_module.MAX_BYTES_ENV, "1.5")
    assert index_cache_module._env_max_bytes() == 3 << 19
    for bad in ("0", "-3", "lots", "inf", "nan"):
        monkeypatch.setenv(index_cache_module.MAX_BYTES_ENV, bad)
        with pytest.raises(ValueError, match="HF_PAGED_INDEX_CACHE_MB"):
            index_cache_module._env_max_bytes()
    with pytest.raises(ValueError, match="max_bytes"):
        IndexCache(max_bytes=0)
    assert IndexCache().max_bytes == 512 << 20


def test_the_servers_processor_cache_weighs_processors_by_their_index(no_warm_up, monkeypatch):
    tok = byte_level_tokenizer()
    sizes = {n: compiled_size(n) for n in (4, 5, 6)}
    assert ConstraintCache(tok, [tok.eos_token_id]).max_bytes == index_cache_module.default_index_cache().max_bytes
    # the processors' own index cache holds everything, so only the processor cache can drop (and keep alive)
    monkeypatch.setattr(index_cache_module, "_DEFAULT", IndexCache(max_bytes=None))
    cache = ConstraintCache(tok, [tok.eos_token_id], max_bytes=sizes[4] + sizes[5] + sizes[6] // 2)
    for n in (4, 5, 6, 4):
        proc = cache.get("json_schema", schema(n))
        assert proc.compiled is not None  # (a request compiles it; the next `get` weighs it)
        assert cache.num_bytes <= cache.max_bytes
    cache.get("json_schema", schema(4))
    assert len(cache) == 2 and cache.num_bytes == sizes[4] + sizes[6]  # 5 went: least recently used


def test_the_retry_validator_memo_keeps_no_processor_alive(no_warm_up):
    tok = byte_level_tokenizer()
    retrier = Retrier()
    proc = JSONSchemaLogitsProcessor(schema(1), tok, index_cache=IndexCache(max_bytes=None))
    params = SamplingParams(logits_processors=[proc], max_retries=1, do_sample=True)
    assert retrier._default(params) is retrier._default(params)  # built once per processor
    ref = weakref.ref(proc)
    del proc, params
    gc.collect()
    assert ref() is None and len(retrier._validators) == 0
