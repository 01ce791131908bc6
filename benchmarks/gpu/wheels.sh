#!/usr/bin/env bash
# Fetches, here, the wheels the lent GPU machine lacks and cannot download (it reaches no package registry):
# cffi and pycparser (gmux._native is built there with cffi; gmuxd --rebind-gpus binds the driver with it) and
# pyzmq (gmux.job's wire). Its python3 is CPython 3.12 on x86-64. They go to .whl/, which git ignores and a
# device run carries (benchmarks/gpu/on_device.sh installs them there).
#   bash benchmarks/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl cffi==2.1.1 pycparser==3.12 pyzmq==27.3.0
ls -l .whl
