#!/usr/bin/env bash
# Creates or updates the project's Python environment: a venv made from Debian's python3
# (python3-venv) with the pinned packages of scripts/requirements.txt (PyPI). Idempotent: a
# venv whose recorded requirements equal the file's is left alone.
#   scripts/python_env.sh            (venv at $DTRAIN_VENV, default ~/.cache/dtrain/venv)
# The default lives outside the clone, beside pip's and ccache's caches: every clone on this
# machine (a developer's worktrees, CI's fresh clone) shares one venv instead of ~6 GB each.
# Prints the venv's python on its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/venv}"
req="$here/scripts/requirements.txt"
stamp="$venv/.dtrain-requirements"
if [[ -x "$venv/bin/python" ]] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "python_env: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
fi
echo "python_env: installing scripts/requirements.txt into $venv (PyPI; PyTorch's wheels are ~3 GB the first time)" >&2
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2; then
  echo "python_env: pip could not install scripts/requirements.txt into $venv;" \
       "check that PyPI is reachable (pip's error is above), then run scripts/setup.sh again" >&2
  exit 1
fi
cp "$req" "$stamp"
echo "$venv/bin/python"
