"""Both stores' byte bound: least recently used out first (a read or a re-put refreshes a block), a blob that
fits exactly evicts nothing, and one larger than the whole bound is refused without evicting anything."""

from __future__ import annotations

import pytest

from hf_paged.kv_transfer.stores import DirectoryStore, InProcessStore


@pytest.fixture(params=["in-process", "directory"])
def make_store(request, tmp_path):
    stores = []

    def make(max_bytes: int):
        store = InProcessStore(max_bytes) if request.param == "in-process" else DirectoryStore(tmp_path / "kv", max_bytes)
        stores.append(store)
        return store

    yield make
    for store in stores:
        getattr(store, "close", lambda: None)()


def _held(store, keys):
    return [k for k in keys if store.contains(k)]


def test_an_exact_fit_evicts_nothing(make_store):
    store = make_store(30)
    for key in (b"a", b"b", b"c"):
        assert store.put(key, b"x" * 10)
    assert _held(store, [b"a", b"b", b"c"]) == [b"a", b"b", b"c"]
    assert store.nbytes == 30


def test_a_read_block_outlives_an_older_unread_one(make_store):
    store = make_store(30)
    for key in (b"a", b"b", b"c"):
        store.put(key, key * 10)
    assert store.get(b"a") == b"a" * 10  # a is the most recently used now; b the least
    assert store.put(b"d", b"d" * 10)
    assert _held(store, [b"a", b"b", b"c", b"d"]) == [b"a", b"c", b"d"]
    assert store.get(b"b") is None
    assert store.nbytes == 30


def test_a_put_again_refreshes_the_block(make_store):
    store = make_store(30)
    for key in (b"a", b"b", b"c"):
        store.put(key, key * 10)
    assert store.put(b"a", b"a" * 10)  # held already: refreshed, not written twice
    assert store.nbytes == 30
    store.put(b"d", b"d" * 10)
    assert _held(store, [b"a", b"b", b"c", b"d"]) == [b"a", b"c", b"d"]


def test_a_bigger_blob_evicts_the_oldest_until_it_fits(make_store):
    store = make_store(30)
    for key in (b"a", b"b", b"c"):
        store.put(key, key * 10)
    assert store.put(b"e", b"e" * 20)
    assert _held(store, [b"a", b"b", b"c", b"e"]) == [b"c", b"e"]
    assert store.nbytes == 30


def test_a_blob_over_the_whole_bound_is_refused_and_evicts_nothing(make_store):
    store = make_store(30)
    for key in (b"a", b"b", b"c"):
        store.put(key, key * 10)
    assert not store.put(b"z", b"z" * 31)
    assert _held(store, [b"a", b"b", b"c", b"z"]) == [b"a", b"b", b"c"]
    assert store.nbytes == 30


@pytest.mark.parametrize("max_bytes", [0, -5, 1.5, "1GB", True])
def test_a_bound_that_is_no_byte_count_is_refused_at_construction(max_bytes, tmp_path):
    """InProcessStore took these: every block was refused then ("1GB": a TypeError logged by the saver thread)."""
    with pytest.raises(ValueError, match=rf"InProcessStore max_bytes must be an int >= 1 .* got {max_bytes!r}"):
        InProcessStore(max_bytes)
    with pytest.raises(ValueError, match=rf"DirectoryStore max_bytes must be an int >= 1, got {max_bytes!r}"):
        DirectoryStore(tmp_path / "kv", max_bytes)
    assert InProcessStore().put(b"k", b"blob") and InProcessStore(4).put(b"k", b"blob")
