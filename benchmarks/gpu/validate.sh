#!/usr/bin/env bash
# The GPU check of the native core and the runtime, as one prepared script (< 8 minutes on one H200): builds the C
# library and its tests, builds gmux._native in place (no network needed: cffi and a compiler only), then runs the
# GPU scripts, each within what is left of BUDGET_S. A step that fails is reported and the next ones still run;
# the exit status says whether any failed. Without a GPU it builds, runs the C tests and the CPU-side checks, and
# says that the GPU checks were skipped. On the lent GPU machine run it through on_device.sh (the wheels it
# lacks, the log and results into $OUT).
#   bash benchmarks/gpu/validate.sh        (PYTHON=... to choose the interpreter)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${BUDGET_S:-450}))
status=0
failed() { echo "validate: FAILED: $1"; status=1; }
# At most $1 seconds, and never past the deadline (15 s at least, to say why it stopped).
left() { local l=$((deadline - SECONDS)); ((l > $1)) && l=$1; ((l < 15)) && l=15; echo "$l"; }

if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, cffi' 2>/dev/null; then py=.venv/bin/python
else py=python3; fi
echo "== python: $py ($($py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for m in cffi zmq cupy pynvml; do $py -c "import $m" 2>/dev/null || echo "validate: $m is missing for $py"; done

echo "== C library and tests"
if cmake -S . -B build/gpu-validate -DCMAKE_BUILD_TYPE=Release >/dev/null &&
   cmake --build build/gpu-validate -j"$(nproc)" >/dev/null; then
  (cd build/gpu-validate && timeout "$(left 120)" ctest --output-on-failure > ctest.log 2>&1) || failed "C tests"
  tail -n 15 build/gpu-validate/ctest.log
  ./build/gpu-validate/test_errors | grep 'cuda backend'
else
  failed "building the C library"
fi

echo "== gmux._native (built afresh: a machine kept warm may hold one of older sources)"
native=1
$py - <<'PY' || { failed "building gmux._native"; native=0; }
import glob, os, sys
sys.path.insert(0, "python")
from build_native import ffibuilder
out = ffibuilder.compile(tmpdir=".", verbose=False)  # no pip, no network: gmux/_native*.so next to the sources
for other in set(glob.glob("gmux/_native*.so")) - {os.path.relpath(out)}:
    os.remove(other)     # (one of another name, from pip install -e, would be imported ahead of it or go stale)
print("built", os.path.relpath(out))
PY

if ((native)); then
  timeout "$(left 120)" $py benchmarks/gpu/validate_gpu.py || failed "validate_gpu.py"
  echo "== a job's memory limit through the routed allocator"
  timeout "$(left 60)" $py benchmarks/gpu/memlimit_gpu.py || failed "memlimit_gpu.py"
else
  echo "validate: validate_gpu.py and memlimit_gpu.py skipped (no gmux._native)"
fi

echo "== in-job runtime on CUDA (state tier): bit-identity, suspend and resume speed"
timeout "$(left 210)" $py benchmarks/gpu/runtime_cuda.py || failed "runtime_cuda.py"

echo "== a training process moved between GPUs by the CUDA driver (gmuxd --rebind-gpus)"
timeout "$(left 110)" $py benchmarks/gpu/rebind_cuda.py --mib 1024 || failed "rebind_cuda.py"
echo "validate: done in ${SECONDS} s, status $status"
exit $status
