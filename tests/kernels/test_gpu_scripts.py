"""The pure-Python parts of scripts/gpu_check.sh (byte counts, verdicts, the table), checked on CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report():
    return _load("gpu_report")


def test_decode_bytes_of_the_acceptance_shape():
    bench = _load("gpu_bench_decode")
    # batch 64 x 4096 keys x 8 KV heads x 128 dims x 2 bytes, for K and V: exactly 1 GiB; plus query and output
    assert bench.decode_bytes([4096] * 64, 32, 8, 128, 2) == (1 << 30) + 2 * 64 * 32 * 128 * 2
    args = bench.parse_args([])
    assert (args.batch, args.context, args.heads, args.kv_heads, args.head_dim, args.dtype) == (
        64,
        4096,
        32,
        8,
        128,
        "bf16",
    )


def test_e2e_workload_is_ragged_and_reproducible():
    e2e = _load("gpu_bench_e2e")
    prompts = e2e.make_workload(64, 32, 1024, 128256, seed=0)
    assert prompts == e2e.make_workload(64, 32, 1024, 128256, seed=0)
    lengths = [len(p) for p in prompts]
    assert len(prompts) == 64 and min(lengths) >= 32 and max(lengths) <= 1024 and len(set(lengths)) > 50
    assert e2e.LLAMA_8B["num_key_value_heads"] == 8 and e2e.LLAMA_8B["intermediate_size"] == 14336


def _write(tmp_path: Path, fraction: float, wrapped_tps: float, failures: int = 0) -> None:
    (tmp_path / "kernel_tests.xml").write_text(
        f'<testsuites><testsuite tests="10" failures="{failures}" errors="0" skipped="1"/></testsuites>'
    )
    decode = {"device": "H200", "shape": "b64", "launch": "x", "copy_bytes_per_s": 4.0e12, "decode_ms": 0.3,
              "decode_bytes": 1, "decode_bytes_per_s": fraction * 4.0e12, "fraction_of_copy": fraction,
              "reference_ms": 3.0, "max_abs_err": 0.004}  # fmt: skip
    (tmp_path / "decode.json").write_text(json.dumps(decode))
    compiled = {"scenario": "s", "kernel": "k", "capability": 90, "registers": 96, "spill_bytes": 0,
                "shared_bytes": 1, "seconds": 1.0, "ok": True, "error": None}  # fmt: skip
    (tmp_path / "compile.json").write_text(json.dumps([compiled]))
    path = {"tokens": 100, "seconds": 1.0, "error": None, "first_tokens": [[1]]}
    e2e = {"device": "H200", "model": "m", "workload": "w", "paths": [
        {**path, "name": "stock generate (padded batch)", "tokens_per_s": 100.0},
        {**path, "name": "transformers generate_batch", "tokens_per_s": 150.0},
        {**path, "name": "hf_paged generate_batch", "tokens_per_s": wrapped_tps},
    ]}  # fmt: skip
    (tmp_path / "e2e.json").write_text(json.dumps(e2e))


def test_report_passes_only_when_every_target_is_met(tmp_path, report, capsys):
    _write(tmp_path, fraction=0.71, wrapped_tps=301.0)
    assert report.main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "9 passed, 0 failed, 1 skipped" in table and "= 71% of copy" in table and "3.01x stock" in table
    assert table.count("PASS") == 4 and "FAIL" not in table and "max 96 registers, 0 B spilled" in table
    for fraction, tps, failures in ((0.69, 301.0, 0), (0.71, 299.0, 0), (0.71, 301.0, 1)):
        _write(tmp_path, fraction=fraction, wrapped_tps=tps, failures=failures)
        assert report.main([str(tmp_path)]) == 1
        assert capsys.readouterr().out.count("FAIL") == 1


def test_report_marks_missing_steps_as_failed(tmp_path, report, capsys):
    assert report.main([str(tmp_path)]) == 1
    table = capsys.readouterr().out
    assert table.count("not run") == 4 and table.count("FAIL") == 3  # a missing compile check is information
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1  # one aligned table


def test_report_sets_the_int4_kernels_side_by_side(tmp_path, report, capsys):
    # The sweep's "int4:split" / "int4:join" rows at the same shapes decide launch.INT4_SPLIT_NIBBLES.
    bench = _load("gpu_bench_decode")
    assert {"int4:join", "int4:split", "int4:4w"} <= set(bench.VARIANTS)
    assert bench.parse_args(["--kv-format", "int4:split"]).kv_format == "int4:split"

    def row(fmt, batch, context, ms):
        return {"shape": f"b{batch} x ctx {context}, 32/8 heads x 128, bf16, block 16, KV {fmt}", "decode_ms": ms,
                "fraction_of_copy": 0.2}  # fmt: skip

    sweep = [row("int4:join", 64, 4096, 0.8), row("int4:split", 64, 4096, 0.4), row("int4:join", 256, 4096, 3.2),
             row("int4:split", 256, 4096, 1.6), row("int4", 64, 4096, 0.8), row("int4:4w", 64, 4096, 0.6)]  # fmt: skip
    (tmp_path / "decode_sweep.json").write_text(json.dumps(sweep))
    report.main([str(tmp_path)])
    table = capsys.readouterr().out
    assert "decode sweep, KV int4:split: 2 shapes" in table and "decode sweep, KV int4:join: 2 shapes" in table
    assert "int4 split-nibble vs joined tiles: 0.50x the time (geo. mean, 2 shapes)" in table
    assert "b64 x ctx 4096 0.400 vs 0.800 ms" in table
    assert "int4 split-nibble, 4 warps vs 8: 1.50x the time (geo. mean, 1 shapes)" in table
