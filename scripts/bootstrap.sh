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
# pip compiles what it installs one file at a time (about a minute for torch and the test frameworks here); all
# cores compile it afterwards in about half that. (Modules must be compiled ahead: these machines run Python with
# PYTHONDONTWRITEBYTECODE=1, so a module compiled at import would be compiled again by every process.)
if [ "$have_torch" = 0 ]; then
  $pip install -q --no-compile -r requirements-cpu.txt
fi
$pip install -q --no-compile --no-build-isolation -e '.[test]'
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# (a few files in torch's own tests are for newer Pythons and do not compile; pip skips them the same way.) gmux's
# own modules too: every job, gmuxd and CLI call imports them (a file edited later is read from its source again).
"$venv/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
"$venv/bin/python" -m compileall -q -j 0 gmux >/dev/null
