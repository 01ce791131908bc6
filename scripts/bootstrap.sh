#!/usr/bin/env bash
# Creates the project's virtual environment. On a machine whose python3 already has torch (a GPU machine),
# the venv sees it through --system-site-packages and keeps it; elsewhere it installs the CPU build pinned
# in requirements-cpu.txt, never a multi-GB CUDA build.
set -euo pipefail
venv=${1:-.venv}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
if python3 -c 'import torch' 2>/dev/null; then
  echo "bootstrap: keeping the torch $(python3 -c 'import torch; print(torch.__version__)') already installed"
  python3 -m venv --system-site-packages "$venv"
  have_torch=1
else
  python3 -m venv "$venv"
  have_torch=0
fi
pip="$venv/bin/python -m pip"
$pip install -q --upgrade pip setuptools wheel cffi
if [ "$have_torch" = 0 ]; then
  $pip install -q -r requirements-cpu.txt
fi
$pip install -q --no-build-isolation -e '.[test]'
