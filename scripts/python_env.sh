#!/usr/bin/env bash
# Creates or updates the project's Python environment: a venv made from Debian's python3
# (python3-venv) with the pinned packages of scripts/requirements.txt (PyPI). Idempotent: a
# venv whose recorded requirements equal the file's is left alone.
#   scripts/python_env.sh [--main]   (venv at $DTRAIN_VENV, default ~/.cache/dtrain/venv)
# --main: only the libtorch the main job builds on - the torch wheel without its dependencies,
# and the two CUDA runtime wheels its CPU library loads (libcudart, libcupti), all pinned in
# requirements.txt (~550 MB instead of the peers' ~6 GB). A later run without --main adds the
# rest to the same venv.
# The default lives outside the clone, beside pip's and ccache's caches: every clone on this
# machine (a developer's worktrees, CI's fresh clone) shares one venv instead of ~6 GB each.
# Prints the venv's python on its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
main_only=0
[[ "${1:-}" == --main ]] && main_only=1
venv="${DTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/venv}"
req="$here/scripts/requirements.txt"
stamp="$venv/.dtrain-requirements"
main_stamp="$venv/.dtrain-requirements-main"
# The main job's pins, taken from requirements.txt (one place for each version).
mapfile -t main_pins < <(grep -E '^(torch|nvidia-cuda-runtime|nvidia-cuda-cupti)==' "$req")
if ((${#main_pins[@]} != 3)); then
  echo "python_env: scripts/requirements.txt must pin torch, nvidia-cuda-runtime and" \
       "nvidia-cuda-cupti (found: ${main_pins[*]:-none})" >&2
  exit 1
fi
if [[ -x "$venv/bin/python" ]] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
if ((main_only)) && [[ -x "$venv/bin/python" ]] && [[ "$(cat "$main_stamp" 2>/dev/null)" == "${main_pins[*]}" ]]; then
  echo "$venv/bin/python"
  exit 0
fi
if [[ ! -x "$venv/bin/python" ]]; then
  echo "python_env: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
fi
if ((main_only)); then
  echo "python_env: installing ${main_pins[*]} into $venv (PyPI, no dependencies: ~550 MB)" >&2
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check --no-deps "${main_pins[@]}" >&2; then
    echo "python_env: pip could not install ${main_pins[*]} into $venv;" \
         "check that PyPI is reachable (pip's error is above), then run scripts/run_main.sh again" >&2
    exit 1
  fi
  echo "${main_pins[*]}" >"$main_stamp"
  echo "$venv/bin/python"
  exit 0
fi
echo "python_env: installing scripts/requirements.txt into $venv (PyPI; PyTorch's wheels are ~3 GB the first time)" >&2
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2; then
  echo "python_env: pip could not install scripts/requirements.txt into $venv;" \
       "check that PyPI is reachable (pip's error is above), then run scripts/setup.sh again" >&2
  exit 1
fi
cp "$req" "$stamp"
echo "$venv/bin/python"
