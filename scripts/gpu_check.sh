#!/usr/bin/env bash
# The GPU machine's whole check (issue #26), in one call of at most ~8 minutes: configure and
# build a CUDA build of dtrain with every core, run the `gpu` tests, run the GPU benchmarks, and
# write the logs and a JSON summary (every figure with the machine) under $OUT.
#
# The GPU machine has PyTorch (with CUDA and NCCL) in its python3, g++, CMake and ninja, but no
# network, no apt, and not every library dtrain builds against. So, on the development machine
# first:
#     bash scripts/gpu_carry.sh          # fills .device/ (git-ignored): Gloo's, nlohmann-json's,
#                                        # CLI11's and zlib's headers, GoogleTest's sources, the
#                                        # Fashion-MNIST files
# then through the device tool's `run`:
#     command:   bash scripts/gpu_check.sh
#     carry:     [".device"]
#     timeout_s: 540
# The summary comes back as $OUT/gpu_summary.json, the logs as $OUT/*.log.
#
# Options (environment): GPU_CHECK_SKIP_BENCH=1 skips the benchmarks; GPU_CHECK_BENCH=LIST picks
# them (bench/gpu_bench.py --only); GPU_CHECK_BUDGET_S=S the whole run's seconds (default 480: a
# benchmark or a CPU-scaling row that would not fit is skipped, and the summary says so); GPU_CHECK_TESTS=REGEX runs only the gpu tests it matches
# (ctest -R; a short second call after a fix); GPU_CHECK_CPU_PROCS=LIST the process counts of the
# CPU-scaling rows (default 1,8,2,4,16; 1 first); GPU_CHECK_JOBS=N build parallelism (default: all
# cores).
# Exit status: 0 when the build and every gpu test passed (benchmarks never fail it).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$here/gpu-check-out}"
mkdir -p "$out"
carry="$here/.device"
build="$here/build-gpu"
jobs="${GPU_CHECK_JOBS:-$(nproc)}"
t_start=$(date +%s)
summary="$out/gpu_summary.json"
log() { echo "gpu_check [$(($(date +%s) - t_start)) s]: $*"; }

python=$(command -v python3)
torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
if [[ -z "$torch_dir" ]]; then
  echo "gpu_check: python3 has no torch; this script runs on the GPU machine (see its header)" >&2
  exit 2
fi
nvidia-smi -L > "$out/machine.log" 2>&1
{ nproc; "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count())';
  g++ --version | head -1; cmake --version | head -1;
  lscpu | grep -E '^(Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\))' | tr -s ' ';
  } >> "$out/machine.log" 2>&1
log "machine: $(tr '\n' ' ' < "$out/machine.log")"

# --- what the machine lacks comes from .device/ (scripts/gpu_carry.sh) -----------------------
config=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DDTRAIN_LIBTORCH="$torch_dir" -DDTRAIN_CUDA=ON
        -DDTRAIN_GPU_TESTS=ON -DDTRAIN_VENV_PYTHON="$python" -DDTRAIN_DATA=OFF)
[[ -d "$carry/gloo" ]] && config+=(-DDTRAIN_GLOO_INCLUDE_DIR="$carry/gloo")
[[ -d "$carry/include" ]] && config+=(-DDTRAIN_EXTRA_INCLUDE_DIR="$carry/include")
[[ -d "$carry/googletest" ]] && config+=(-DDTRAIN_GTEST_SOURCE_DIR="$carry/googletest")
if [[ ! -e /usr/include/zlib.h && -e "$carry/include/zlib.h" ]]; then
  libz=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/ {print $NF; exit}')
  config+=(-DZLIB_INCLUDE_DIR="$carry/include" -DZLIB_LIBRARY="${libz:-/usr/lib/x86_64-linux-gnu/libz.so.1}")
fi
data="/usr/share/datasets/fashion-mnist"
if [[ ! -e "$data/train-images-idx3-ubyte.gz" && -d "$carry/fashion-mnist" ]]; then
  mkdir -p "$(dirname "$data")" && ln -sfn "$carry/fashion-mnist" "$data"
fi

log "configure"
if ! cmake -S "$here" -B "$build" "${config[@]}" > "$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log"
  echo '{"stage": "configure", "ok": false}' > "$summary"
  exit 1
fi
grep "dtrain:" "$out/configure.log"
targets=(dtrain_cli dtrain_forkserver gpu_test gpu_worker fashion_mnist hello_worker gpu_train_bench)
log "build (${#targets[@]} targets, -j $jobs)"
t_build=$(date +%s)
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- -k 0 > "$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -60
  echo '{"stage": "build", "ok": false}' > "$summary"
  exit 1
fi
build_s=$(($(date +%s) - t_build))

log "gpu tests"
t_test=$(date +%s)
(cd "$build" && ctest -L gpu ${GPU_CHECK_TESTS:+-R "$GPU_CHECK_TESTS"} --output-on-failure --timeout 400 --output-junit "$out/gpu_tests.xml") \
  > "$out/tests.log" 2>&1
tests_rc=$?
test_s=$(($(date +%s) - t_test))
grep -E "tests passed|Test +#|Passed|Failed|\*\*\*" "$out/tests.log" | tail -40

bench_rc=0
if [[ "${GPU_CHECK_SKIP_BENCH:-0}" != 1 ]]; then
  log "benchmarks"
  # What is left of the 8 minutes, less ~10 s for the summary: what would not fit is skipped and
  # named in the summary (GPU_CHECK_BUDGET_S: another total).
  budget=$(( ${GPU_CHECK_BUDGET_S:-480} - ($(date +%s) - t_start) - 10 ))
  "$python" "$here/bench/gpu_bench.py" --build-dir "$build" --json "$out/gpu_bench.json" \
    --budget-s "$budget" ${GPU_CHECK_BENCH:+--only "$GPU_CHECK_BENCH"} \
    ${GPU_CHECK_CPU_PROCS:+--cpu-procs "$GPU_CHECK_CPU_PROCS"} 2>&1 | tee "$out/bench.log"
  bench_rc=${PIPESTATUS[0]}
fi

"$python" - "$out" "$tests_rc" "$bench_rc" "$build_s" "$test_s" "$(($(date +%s) - t_start))" <<'EOF'
import json, os, sys, xml.etree.ElementTree as ET
out, tests_rc, bench_rc, build_s, test_s, total_s = sys.argv[1], *map(int, sys.argv[2:])
s = {"ok": tests_rc == 0, "tests_rc": tests_rc, "bench_rc": bench_rc,
     "seconds": {"build": build_s, "tests": test_s, "total": total_s},
     "machine": open(os.path.join(out, "machine.log")).read().strip().splitlines()}
try:
    root = ET.parse(os.path.join(out, "gpu_tests.xml")).getroot()
    s["tests"] = {c.get("name"): ("failed" if c.find("failure") is not None else
                                  "skipped" if c.find("skipped") is not None else "passed")
                  for c in root.iter("testcase")}
except (OSError, ET.ParseError) as e:
    s["tests"] = f"no junit report: {e}"
try:
    s["bench"] = json.load(open(os.path.join(out, "gpu_bench.json")))
except (OSError, ValueError):
    s["bench"] = None
json.dump(s, open(os.path.join(out, "gpu_summary.json"), "w"), indent=1)
print(json.dumps({k: s[k] for k in ("ok", "seconds", "tests")}, indent=1))
EOF
log "done: tests $([[ $tests_rc -eq 0 ]] && echo passed || echo FAILED), benchmarks rc $bench_rc"
exit "$tests_rc"
