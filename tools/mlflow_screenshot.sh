#!/usr/bin/env bash
# Screenshots a page of MLflow's UI with headless Chromium (Debian's `chromium`).
#   tools/mlflow_screenshot.sh URL OUT.png [WIDTHxHEIGHT]
# e.g. URL = http://127.0.0.1:5000/#/experiments/1/runs/RUN_ID/model-metrics (the run's
# metric charts). The UI is a single-page app: Chromium's virtual time budget lets its
# scripts fetch the run and draw the charts before the picture is taken.
set -euo pipefail
url="${1:?usage: tools/mlflow_screenshot.sh URL OUT.png [WIDTHxHEIGHT]}"
out="${2:?usage: tools/mlflow_screenshot.sh URL OUT.png [WIDTHxHEIGHT]}"
size="${3:-1400x900}"
browser="$(command -v chromium || command -v chromium-browser || true)"
if [[ -z "$browser" ]]; then
  echo "mlflow_screenshot: chromium is not installed (scripts/setup.sh installs Debian's chromium)" >&2
  exit 1
fi
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
rm -f "$out"
timeout 120 "$browser" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
  --no-first-run --user-data-dir="$profile" --window-size="${size/x/,}" --virtual-time-budget=60000 \
  --screenshot="$out" "$url" >/dev/null 2>"$profile/stderr" || {
  echo "mlflow_screenshot: chromium failed:" >&2
  tail -20 "$profile/stderr" >&2
  exit 1
}
[[ -s "$out" ]] || { echo "mlflow_screenshot: chromium wrote no screenshot to $out" >&2; tail -20 "$profile/stderr" >&2; exit 1; }
echo "$out"
