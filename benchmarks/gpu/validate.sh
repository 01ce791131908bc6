#!/usr/bin/env bash
# The GPU check of the native core and the runtime, as one prepared script (< 8 minutes on one H200): builds the C library
# and its tests, builds gmux._native in place (no network needed: cffi and a compiler only), then runs
# validate_gpu.py. Without a GPU it builds, runs the C tests and the CPU-side checks, and says that the
# GPU checks were skipped.
#   bash benchmarks/gpu/validate.sh        (PYTHON=... to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, cffi' 2>/dev/null; then py=.venv/bin/python
else py=python3; fi
echo "== python: $py ($($py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== C library and tests"
cmake -S . -B build/gpu-validate -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/gpu-validate -j"$(nproc)" >/dev/null
(cd build/gpu-validate && ctest --output-on-failure | tail -n 4)
./build/gpu-validate/test_errors | grep 'cuda backend' || true

echo "== gmux._native"
if $py -c 'import gmux._native' 2>/dev/null; then
  echo "already built (pip install -e .)"
else
  $py -c 'import cffi' 2>/dev/null || { echo "validate: cffi is missing for $py (pip install cffi)"; exit 1; }
  $py - <<'PY'
import os, sys
sys.path.insert(0, "python")
from build_native import ffibuilder
out = ffibuilder.compile(tmpdir=".", verbose=False)  # no pip, no network: gmux/_native*.so next to the sources
print("built", os.path.relpath(out))
PY
fi

status=0
timeout 300 $py benchmarks/gpu/validate_gpu.py || status=$?

echo "== a job's memory limit through the routed allocator"
timeout 120 $py benchmarks/gpu/memlimit_gpu.py || status=$?

echo "== in-job runtime on CUDA (state tier): bit-identity, suspend and resume speed"
timeout 150 $py benchmarks/gpu/runtime_cuda.py || status=$?

echo "== a training process moved between GPUs by the CUDA driver (gmuxd --rebind-gpus)"
timeout 150 $py benchmarks/gpu/rebind_cuda.py --mib 1024 || status=$?
exit $status
