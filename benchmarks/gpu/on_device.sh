#!/usr/bin/env bash
# The command a run on the lent GPU machine gives (the device tool: carry [".whl"], timeout_s 540):
#   bash benchmarks/gpu/on_device.sh
# It installs the carried wheels (benchmarks/gpu/wheels.sh fetches them here) beside that machine's packages,
# runs validate.sh within VALIDATE_S seconds, and leaves its whole log and the JSON of each step in $OUT, which
# comes back even when the run is cut off.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-benchmarks/results}
mkdir -p "$out" benchmarks/results
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gmux-site \
    .whl/*.whl || { echo "on_device: the carried wheels did not install"; exit 1; }
  export PYTHONPATH=/tmp/gmux-site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "on_device: no .whl/ carried (bash benchmarks/gpu/wheels.sh here first): cffi and pyzmq may be missing"
fi
export PYTHONUNBUFFERED=1
timeout "${VALIDATE_S:-500}" bash benchmarks/gpu/validate.sh 2>&1 | tee "$out/validate.log"
rc=${PIPESTATUS[0]}
for f in gpu_validate suspend_resume_cuda rebind_cuda memlimit_gpu; do
  [ -f "benchmarks/results/$f.json" ] && [ "$out" != benchmarks/results ] && cp "benchmarks/results/$f.json" "$out/"
done
echo "on_device: validate.sh rc=$rc"
exit "$rc"
