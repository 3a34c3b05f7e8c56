#!/usr/bin/env bash
# One command for a CUDA machine (issue 7): the kernel tests compiled (no interpreter, bf16 included; the quantized
# fused-dequant kernels too), the paged decode bandwidth micro-benchmark (bf16, then int8 and int4 caches), and the
# end-to-end throughput comparison; then one table.
#
#   scripts/gpu_check.sh                       # results in a temporary folder, printed at the end
#   GPU_CHECK_OUT=$OUT scripts/gpu_check.sh    # keep the junit / json files there
#
# Needs: CUDA torch, triton, transformers. Takes ~5-8 minutes on an H200 (mostly building the 8B model and the
# three generation runs). Exit status 0 only when every check with a target passed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled kernels: the interpreter would hide what only the GPU checks
PY=${PYTHON:-python3}
RESULTS=${GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$RESULTS"

if ! "$PY" - <<'PYEOF'
import sys, torch, triton, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, "
      f"transformers {transformers.__version__}")
if not torch.cuda.is_available():
    sys.exit("no CUDA device: run scripts/gpu_check.sh on a GPU machine (CPU tests: pytest tests/kernels)")
print(torch.cuda.get_device_name(0))
import hf_paged.cache.kernels  # fails here, not midway, if a dependency of the package is missing
try:
    import outlines_core  # noqa: F401
except ImportError:
    print("warning: outlines-core is missing; hf_paged's JSON/regex processors will not import (not needed here)")
PYEOF
then
    echo "gpu_check: preflight failed (see above)" >&2
    exit 2
fi

echo "== 0/3 compile check for this device (registers, spills) =="
CAP=$("$PY" -c "import torch; m, n = torch.cuda.get_device_capability(); print(10 * m + n)")
timeout "${GPU_CHECK_COMPILE_TIMEOUT:-120}" "$PY" scripts/gpu_compile_check.py --quick --capability "$CAP" \
    --json "$RESULTS/compile.json" 2>&1 | grep -v -i warning

echo "== 1/3 kernel tests, compiled =="
# -m "not slow" replaces the default "not slow and not gpu": the gpu-marked (bf16) tests run here. The AOT
# compile test is step 0 already.
timeout "${GPU_CHECK_TEST_TIMEOUT:-360}" "$PY" -m pytest tests/kernels -q -m "not slow" -p no:cacheprovider \
    --deselect tests/kernels/test_kernel_compile.py --junitxml="$RESULTS/kernel_tests.xml" 2>&1 | tail -n 40

echo "== 2/3 paged decode attention vs copy bandwidth =="
timeout "${GPU_CHECK_DECODE_TIMEOUT:-180}" "$PY" scripts/gpu_bench_decode.py --json "$RESULTS/decode.json"
for fmt in int8 int4; do  # the fused-dequant kernel on the same shape: bytes actually read, beside bf16
    timeout "${GPU_CHECK_DECODE_TIMEOUT:-180}" "$PY" scripts/gpu_bench_decode.py --kv-format "$fmt" \
        --json "$RESULTS/decode_$fmt.json" | grep -E '"(shape|decode_ms|decode_bytes_per_s|max_abs_err)"'
done

echo "== 3/3 end-to-end throughput =="
timeout "${GPU_CHECK_E2E_TIMEOUT:-420}" "$PY" scripts/gpu_bench_e2e.py --json "$RESULTS/e2e.json"

echo
echo "== results ($RESULTS) =="
"$PY" scripts/gpu_report.py "$RESULTS"
