"""A process forked while the kernels load (a DataLoader or pool worker forked right after a processor or an engine
was built) loads them itself: the parent's loader thread does not exist in the child, and before this the child kept
the Python bodies / the torch path for its whole life (`jit.wait` never returned True there).

End to end (a fork mid-load on an empty cache, the child compiled 57 s later) this was checked by hand; these tests
drive the after-fork hooks directly, with no compile."""

from __future__ import annotations

import threading

from hf_paged.cache.kernels import cpu_warm
from hf_paged.processors import jit
from hf_paged.processors.automaton import nfa_kernel


def test_a_child_forked_mid_load_starts_a_loader_at_its_first_kernel_call(monkeypatch):
    kernel, started = nfa_kernel.regex_nfa, []
    monkeypatch.setattr(jit, "_DONE", threading.Event())  # the parent was loading ...
    monkeypatch.setattr(jit, "_thread", threading.Thread(target=lambda: None))  # ... on a thread the child lacks
    monkeypatch.setattr(jit, "_restart", False)
    monkeypatch.setattr(jit, "start", lambda: started.append(1))
    monkeypatch.setattr(kernel, "compiled", None)
    monkeypatch.setattr(kernel, "python", lambda *args: "python body")
    jit._after_fork_in_child()  # what os.fork runs in the child
    assert jit._thread is None and not jit._DONE.is_set()
    assert kernel() == "python body" and started == [1]


def test_a_child_forked_after_the_load_keeps_it(monkeypatch):
    done = threading.Event()
    done.set()
    loader = threading.Thread(target=lambda: None)
    monkeypatch.setattr(jit, "_DONE", done)
    monkeypatch.setattr(jit, "_thread", loader)
    monkeypatch.setattr(jit, "_restart", False)
    jit._after_fork_in_child()
    assert jit._DONE.is_set() and jit._DONE is not done and jit._thread is loader and not jit._restart


def test_an_engine_forked_mid_load_starts_its_variant_at_its_next_step(monkeypatch):
    loading = cpu_warm.KernelVariant((("int8", False, False, False), ("int8", False, False, False)))
    ready = threading.Event()
    ready.set()
    prepared = []
    monkeypatch.setattr(cpu_warm, "_started", {cpu_warm.PLAIN: ready, loading: threading.Event()})
    monkeypatch.setattr(cpu_warm, "_lock", threading.Lock())
    monkeypatch.setattr(cpu_warm, "_pending_after_fork", [])
    monkeypatch.setattr(cpu_warm, "prepare", lambda variants: prepared.append(list(variants)))
    cpu_warm._after_fork_in_child()
    assert list(cpu_warm._started) == [cpu_warm.PLAIN]
    cpu_warm.ready_variants()  # a step's metadata
    cpu_warm.ready_variants()
    assert prepared == [[loading]]
