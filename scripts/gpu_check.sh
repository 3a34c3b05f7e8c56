#!/usr/bin/env bash
# One command for a CUDA machine (issues 7, 36, 42), under 10 minutes on an H200:
#   1. the CUDA-capable tests: the kernels compiled (no interpreter, bf16 and the quantized fused-dequant kernels
#      included) and tests/gpu (greedy fp32 parity with stock generate on CUDA, seeded sampling with forks,
#      max_retries, sampled speculation, int8 / int4 KV, a JSON-schema constraint, the server on 127.0.0.1);
#   2. paged decode attention against a plain copy of the same bytes: bf16 / int8 / int4 KV, batch 1-256,
#      context 512-32k, and launch variants (int8/fp8 scales folded or not, 4 or 8 warps; int4 on the joined
#      tiles and on the split-nibble kernel, 8 or 4 warps: what launch.INT4_SPLIT_NIBBLES waits for);
#   3. end to end on a ragged workload, a ~1B random Llama in bf16: stock padded `generate`, transformers'
#      `generate_batch` with its CUDA graphs off and on, hf_paged's `generate_batch` with its decode graphs on
#      (the default on CUDA) and off; then benchmarks/prefix.py's shared-prefix workload (a 1000-token system
#      prompt, one question per request) over the same paths, hf_paged with its prefix caching off too;
#   4. the command line on CUDA (scripts/gpu_cli_check.py): `bench`, `generate --schema`, `serve` with int8 KV;
# then one table (scripts/gpu_report.py). Every file lands in $GPU_CHECK_OUT (a temporary folder otherwise).
#
#   scripts/gpu_check.sh
#   GPU_CHECK_OUT=$OUT scripts/gpu_check.sh
#   GPU_CHECK_E2E_TIMEOUT=0 scripts/gpu_check.sh     # a stage's time limit (seconds) at 0 skips it
#
# Python packages the machine lacks can travel as wheels in .whl/ (cp312 manylinux; see the device notes): they
# are installed into /tmp/site first. Exit status 0 only when every check with a target passed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 2
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled kernels: the interpreter would hide what only the GPU checks
RESULTS=${GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$RESULTS"

if ! "$PY" - <<'PYEOF'
import sys, torch, triton, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, "
      f"transformers {transformers.__version__}")
if not torch.cuda.is_available():
    sys.exit("no CUDA device: run scripts/gpu_check.sh on a GPU machine (CPU tests: pytest tests/kernels)")
print(torch.cuda.get_device_name(0))
import hf_paged  # fails here, not midway, if a dependency of the package is missing
PYEOF
then
    echo "gpu_check: preflight failed (see above)" >&2
    exit 2
fi

echo "== 1/4 CUDA tests (kernels compiled, tests/gpu) =="
# -m "not slow" replaces the default "not slow and not gpu": the gpu-marked tests run here. Workers compile the
# Triton kernels in parallel; each test has a time limit so that one hang cannot eat the run.
# Every gpu-marked test file lies under one of these (tests/test_gpu_check_paths.py).
GPU_TEST_PATHS=(tests/kernels tests/gpu tests/processors/test_bitmask.py tests/batching/test_logprobs_cuda.py)
XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n ${GPU_CHECK_WORKERS:-8}")
[ "${GPU_CHECK_TEST_TIMEOUT:-160}" -gt 0 ] && timeout "${GPU_CHECK_TEST_TIMEOUT:-160}" "$PY" -m pytest "${GPU_TEST_PATHS[@]}" \
    -q -m "not slow" -p no:cacheprovider $XDIST --deselect tests/kernels/test_kernel_compile.py \
    --junitxml="$RESULTS/kernel_tests.xml" -rfE --tb=short \
    $("$PY" -c "import pytest_timeout" 2>/dev/null && echo --timeout=100) 2>&1 | tee "$RESULTS/kernel_tests.log" | tail -n 40

echo "== 2/4 paged decode attention vs copy bandwidth (bf16, int8, int4 KV) =="
[ "${GPU_CHECK_DECODE_TIMEOUT:-130}" -gt 0 ] && timeout "${GPU_CHECK_DECODE_TIMEOUT:-130}" "$PY" scripts/gpu_bench_decode.py --sweep --warmup 3 --iters 20 \
    --copy-bytes $((1 << 30)) --json "$RESULTS/decode_sweep.json" 2>&1 | tee "$RESULTS/decode.log" | grep '^|'

echo "== 3/4 end-to-end throughput, ~1B Llama, bf16: ragged, then shared prefix =="
[ "${GPU_CHECK_E2E_TIMEOUT:-230}" -gt 0 ] && timeout "${GPU_CHECK_E2E_TIMEOUT:-230}" "$PY" scripts/gpu_bench_e2e.py --json "$RESULTS/e2e.json" 2>&1 \
    | tee "$RESULTS/e2e.log" | grep -E '"(name|tokens_per_s|seconds|error|note)"'

echo "== 4/4 the command line on CUDA as a new user runs it: bench, generate --schema, serve =="
cli_status=0
if [ "${GPU_CHECK_CLI_TIMEOUT:-150}" -gt 0 ]; then
    timeout "${GPU_CHECK_CLI_TIMEOUT:-150}" "$PY" scripts/gpu_cli_check.py 2>&1 | tee "$RESULTS/cli.log" | grep '^|'
    cli_status=${PIPESTATUS[0]}
fi

echo
echo "== results ($RESULTS) =="
"$PY" scripts/gpu_report.py "$RESULTS" && [ "$cli_status" -eq 0 ]
