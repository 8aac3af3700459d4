#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang with ASan + UBSan) in build-fuzz/ and runs
# each for a given time, one after the other, from its seed corpus.
#   scripts/fuzz.sh [--seconds N] [--smoke] [--jobs N] [TARGET ...]
#     --seconds N   run each target N seconds (default 600)
#     --smoke       only replay each target's corpus and fuzz it 5 s (a quick local check;
#                   CI never fuzzes: the normal suite replays the corpora, FuzzReplay.*)
#     --no-build    run the targets build-fuzz/ has (while another build of it is under way)
#     TARGET        the names in tests/fuzz/targets.cmake (default: all)
# The working corpus grows in build-fuzz/corpus/TARGET (seeded from tests/fuzz/corpus/TARGET);
# a crash, leak, timeout or out-of-memory input lands in build-fuzz/findings/TARGET/. Prints a
# line per target: executions, coverage (libFuzzer's edges and features), corpus size, and
# the findings; exits 1 if any target found something. Add a finding to
# tests/fuzz/regressions/TARGET/ once it is fixed: the normal suite replays it from then on.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DTRAIN_FUZZ_BUILD:-$here/build-fuzz}"
seconds=600
smoke=0
build_it=1
jobs="$(nproc)"
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --smoke) smoke=1; seconds=5; shift ;;
    --no-build) build_it=0; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ is missing; scripts/setup.sh installs it (clang, libclang-rt-14-dev)" >&2
  exit 2
fi

# The venv scripts/setup.sh made (not re-made here: this tree needs only its path).
venv_python="${DTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/venv}/bin/python"
flags="-g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
# The targets that need libtorch (codec, elastic_commit) build against the venv's PyTorch 2.x:
# Debian's libtorch 1.13 headers do not compile with clang 14 in C++20 (an incomplete
# c10::IValue in std::vector).
if ((build_it)) || [[ ! -f "$build/build.ninja" ]]; then
  libtorch="$("$venv_python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)" ||
    { echo "fuzz.sh: no torch in $venv_python; run scripts/setup.sh" >&2; exit 2; }
  CC=clang CXX=clang++ cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" -DDTRAIN_FUZZ=ON -DDTRAIN_BUILD_TESTS=OFF \
    -DDTRAIN_BUILD_EXAMPLES=OFF -DDTRAIN_BUILD_BENCH=OFF -DDTRAIN_VENV_PYTHON="$venv_python" \
    -DDTRAIN_LIBTORCH="$libtorch" \
    "-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$here;CCACHE_COMPILERCHECK=content;ccache" \
    >/dev/null
fi
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(sed -n 's/^dtrain_fuzz(\([a-z_0-9]*\).*/\1/p' "$here/tests/fuzz/targets.cmake")
fi
((build_it)) && cmake --build "$build" -j "$jobs" -t $(printf '%s_fuzz ' "${targets[@]}")

# libtorch's own leaks at exit (its registries) are not ours; see scripts/sanitize.sh.
export LSAN_OPTIONS="suppressions=$here/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
failed=0
printf '%-18s %12s %8s %8s %8s %s\n' target executions cov ft corpus findings
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t" findings="$build/findings/$t" log="$build/logs/$t.log"
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  # 4 KiB holds every target's inputs but one: a deletion vector's bitset container alone is
  # 8 KiB (a roaring bitmap switches to one above 4096 values in a 65536 range).
  max_len=4096
  [[ "$t" == deletion_vector ]] && max_len=20000
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
        -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$findings/")
  rc=0
  if ((smoke)); then
    # The committed seeds and regressions only: nothing accumulates between smoke runs.
    corpus="$(mktemp -d)"
    regressions=()
    [[ -d "$here/tests/fuzz/regressions/$t" ]] && regressions=("$here/tests/fuzz/regressions/$t")
    nice "$build/fuzz/${t}_fuzz" "${args[@]}" "$corpus" "$here/tests/fuzz/corpus/$t" \
      "${regressions[@]}" >"$log" 2>&1 || rc=$?
    rm -rf "$corpus"
  else
    nice "$build/fuzz/${t}_fuzz" "${args[@]}" "$corpus" "$here/tests/fuzz/corpus/$t" \
      >"$log" 2>&1 || rc=$?
  fi
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  last="$(grep -E '^#[0-9]+' "$log" | tail -1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
  corp="$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")"
  found="$(ls "$findings" 2>/dev/null | tr '\n' ' ')"
  printf '%-18s %12s %8s %8s %8s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
    "${found:-none}"
  if ((rc != 0)) || [[ -n "$found" ]]; then
    failed=1
    echo "fuzz.sh: $t failed (exit $rc); its log: $log" >&2
    grep -m 3 -E 'ERROR|SUMMARY|fuzz:|runtime error' "$log" >&2 || true
  fi
done
exit "$failed"
