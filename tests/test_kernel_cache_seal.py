"""A cached numba kernel is valid for the digest of every file it compiles from, not only its own file's stamp (what
numba keys on): a stale binary built against an older helper in another module crashed the CPU attention kernel
(SIGABRT / SIGSEGV mid-step) in a checkout whose helpers had changed, and would after an upgrade."""

from __future__ import annotations

import importlib.util
import sys

import numba

from hf_paged.background_compile import sources_digest
from hf_paged.compat import numba_cache_index, seal_numba_cache

KERNEL = '''
from numba import njit

@njit(cache=True)
def twice(x):
    return 2 * x
'''


def _fresh_dispatcher(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.twice


def test_a_sealed_cache_is_stale_under_another_digest(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "kernel_mod.py"
    source.write_text(KERNEL)
    first = _fresh_dispatcher(source, "kernel_mod_a")
    seal_numba_cache([first], "digest-1")
    assert first(3) == 6 and numba_cache_index(first)  # compiled and cached under digest-1
    same = _fresh_dispatcher(source, "kernel_mod_b")
    seal_numba_cache([same], "digest-1")
    seal_numba_cache([same], "digest-1")  # idempotent
    assert numba_cache_index(same)  # the same sources: loaded, not recompiled
    from hf_paged.cache.kernels.cpu_warm import CpuLaunch, in_cache

    # the probe that decides whether a process needs a compiling child reads it as cached (it read every entry
    # as missing, numba 0.68's keys having a third item, and started a child in every process)
    assert in_cache(CpuLaunch(same, (3,))) and not in_cache(CpuLaunch(same, (3.5,)))
    other = _fresh_dispatcher(source, "kernel_mod_c")
    seal_numba_cache([other], "digest-2")
    assert not numba_cache_index(other)  # a helper changed somewhere: the cached binary is not used


def test_the_kernel_families_are_sealed_with_their_sources():
    """The CPU attention kernels and the processors' kernels carry their family's digest in their cache stamp."""
    from hf_paged.cache.kernels import cpu_attention, cpu_quantized
    from hf_paged.cache.kernels.cpu_prefetch import CPU_KERNEL_SOURCES
    from hf_paged.processors import jit

    salt = sources_digest(*CPU_KERNEL_SOURCES)
    for kernel in (cpu_attention.attend_plain, cpu_attention.attend_plain_parallel, cpu_quantized.attend_quantized):
        assert kernel._cache._cache_file._source_stamp[-1] == salt
    jit._dispatchers()  # what the loader thread and the compiling child run
    salt = sources_digest(*jit.KERNEL_SOURCES)
    assert jit._KERNELS and all(k.dispatcher._cache._cache_file._source_stamp[-1] == salt for k in jit._KERNELS)
