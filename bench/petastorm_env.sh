#!/usr/bin/env bash
# Makes the venv of the data benchmark's Petastorm peer (bench/data_bench.py): Petastorm 0.13.1,
# the newest on PyPI, imports pyarrow.filesystem, which pyarrow 16 removed, so it cannot live
# in the project's venv (pyarrow 25, numpy 2). This one is Debian's python3 with its own
# site-packages visible (python3-torch 1.13 and numpy 1.24 from scripts/setup.sh) plus the
# pinned Petastorm, pyarrow 14 and pandas 2.0 from PyPI. Idempotent; prints the venv's python.
#   bench/petastorm_env.sh        (venv at $DTRAIN_PETASTORM_VENV, default ~/.cache/dtrain/petastorm-venv)
set -euo pipefail
venv="${DTRAIN_PETASTORM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/petastorm-venv}"
pins=(petastorm==0.13.1 pyarrow==14.0.2 pandas==2.0.3 dill==0.4.1 diskcache==5.6.3 future==1.0.0
  pyzmq==27.3.0 fsspec==2026.9.0 packaging==24.2)
stamp="$venv/.dtrain-pins"
if [[ -x "$venv/bin/python" ]] && [[ "$(cat "$stamp" 2>/dev/null)" == "${pins[*]}" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null ||
  { echo "petastorm_env: Debian's python3-torch and python3-numpy are missing: run scripts/setup.sh" >&2; exit 1; }
[[ -x "$venv/bin/python" ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
# --no-deps for petastorm: it asks for pyspark (only for its Spark converter, not used here).
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]:1}" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${pins[0]}" >&2
echo "${pins[*]}" >"$stamp"
echo "$venv/bin/python"
