"""Kernels compile off the caller's clock, one compiling child per cache, no orphans (issue 36, points 1 and 2).

The first two tests run fresh interpreters on an empty `NUMBA_CACHE_DIR`, what the first run after an install sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache import attention_backends
from hf_paged.cache.kernels import cpu_warm
from tests.tiny_models import ragged_prompts

ROOT = Path(__file__).resolve().parent.parent
CHILD_MARK = "hf_paged.background_compile import child_main"


def _compile_children(cache_dir: str) -> list[int]:
    """Pids of compiling children whose numba cache is `cache_dir`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if CHILD_MARK not in (entry / "cmdline").read_bytes().decode(errors="replace"):
                continue
            if f"NUMBA_CACHE_DIR={cache_dir}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # (gone meanwhile)
            continue
    return pids


def _env(cache_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HF_PAGED_JIT"}
    env.update(NUMBA_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    return env


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_processes_started_together_compile_in_one_child_and_leave_none_behind(tmp_path):
    # each: the processors' kernels and the CPU attention kernels both want compiling; then it exits
    code = textwrap.dedent("""
        import time
        from hf_paged.processors import jit
        from hf_paged.cache.kernels import cpu_warm
        jit.start()
        cpu_warm.prepare([cpu_warm.PLAIN])
        time.sleep(4)
    """)
    env = _env(tmp_path)
    parents = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for _ in range(8)]
    most = 0
    while any(p.poll() is None for p in parents):
        most = max(most, len(_compile_children(str(tmp_path))))
        time.sleep(0.1)
    assert all(p.returncode == 0 for p in parents)
    assert most == 1, f"{most} compiling children at once (one expected: the cache was empty)"
    deadline = time.monotonic() + 60
    while _compile_children(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _compile_children(str(tmp_path)), "a compiling child outlived its parent by 60 s"


def test_an_engine_serves_on_torch_until_its_kernels_load_then_switches(tmp_path):
    code = textwrap.dedent("""
        import torch
        from hf_paged import Engine, PagedConfig, SamplingParams
        from hf_paged.cache.kernels import cpu_attention, cpu_warm
        from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model

        model = tiny_model("llama")
        prompts = ragged_prompts([5, 30, 12])
        expected = stock_greedy(model, prompts, 8)
        engine = Engine(model, PagedConfig(block_size=8))
        params = SamplingParams(max_new_tokens=8)

        def run():
            ids = [engine.add_request(p, params) for p in prompts]
            outs = engine.run(ids)
            return [outs[i].generated_tokens for i in ids]

        assert run() == expected
        # nothing compiled in this process: the first request ran on the torch path
        assert not cpu_attention.attend_plain.overloads and cpu_warm.PLAIN not in cpu_warm.ready_variants()
        assert cpu_warm.wait([cpu_warm.PLAIN], timeout=600)
        assert run() == expected
        assert cpu_attention.attend_plain.overloads  # the kernels ran once loaded
        print("OK")
    """)
    done = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), cwd=ROOT, capture_output=True, check=False,
                          text=True, timeout=900)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


def _tiny_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        eos_token_id=None, pad_token_id=0)).eval()


@pytest.mark.parametrize("settings", [{}, {"kv_cache_dtype": "int8"},
                                      {"kv_cache_dtype": "int4", "value_quant_group": "head",
                                       "kv_scale_format": "log8"}], ids=["plain", "int8", "int4 head log8"])
def test_the_warmed_signatures_are_the_ones_a_step_calls(settings, monkeypatch):
    # once a variant is ready, an engine's steps call only signatures the warm-up loaded: nothing compiles then
    model = _tiny_llama()
    config = PagedConfig(block_size=8, max_num_batched_tokens=32, **settings)
    engine = Engine(model, config)
    spec = engine.cache.compression
    variant = cpu_warm.variant_of(spec.key_format, spec.value_format) if engine.cache.compressed else cpu_warm.PLAIN
    assert cpu_warm.wait([variant], timeout=600), "the CPU kernels did not load"
    kernels = {launch.kernel for launch in cpu_warm.warm_launches(variant, parallel=True)}
    before = {k: len(k.overloads) for k in kernels}
    calls = []
    original = attention_backends.run_cpu_attention
    monkeypatch.setattr(attention_backends, "run_cpu_attention",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    for threads in (1, 2):  # serial and parallel variants
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        outs = engine.run([engine.add_request(p, SamplingParams(max_new_tokens=6))
                           for p in ragged_prompts([3, 17, 40])])
        assert all(len(o.generated_tokens) == 6 for o in outs.values())
    assert calls, "the steps never reached the CPU kernels"
    assert {k: len(k.overloads) for k in kernels} == before, "a step compiled a signature the warm-up missed"


def test_the_loader_frees_its_warm_up_tensors_before_a_waiter_wakes(monkeypatch):
    """A script that waits for a variant and returns made the process abort at exit now and then ("terminate called
    without an active exception", status 134, after a first compile): the daemon loader thread, woken waiter gone,
    was still freeing its warm-up tensors, released the GIL inside torch's dealloc, found the interpreter finalizing
    and exited through C++ frames. Its tensors are now gone before any waiter is woken."""
    import threading
    import weakref

    tensors: list[weakref.ref] = []
    alive_at_wake: list[bool] = []

    class Launch:
        def __init__(self) -> None:
            self.tensor = torch.zeros(4)
            tensors.append(weakref.ref(self.tensor))

        def run(self) -> None:
            pass

    class Wake(threading.Event):
        def set(self) -> None:
            alive_at_wake.append(any(ref() is not None for ref in tensors))
            super().set()

    variant = cpu_warm.KernelVariant((("int8", False, False, False), ("int8", False, False, False)))
    monkeypatch.setattr(cpu_warm, "warm_launches", lambda v, parallel: [Launch(), Launch()])
    monkeypatch.setattr(cpu_warm, "in_cache", lambda launch: True)  # nothing to compile
    monkeypatch.setattr(cpu_warm, "_started", {variant: Wake()})
    monkeypatch.setattr(cpu_warm, "_ready", set())
    monkeypatch.setattr(cpu_warm, "_ready_snapshot", frozenset())
    cpu_warm._load([variant])  # the loader thread's body, here on this thread
    assert tensors and alive_at_wake == [False]
    assert variant in cpu_warm.ready_variants()
