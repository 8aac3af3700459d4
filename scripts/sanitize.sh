#!/usr/bin/env bash
# Builds dtrain with sanitizers in a tree of its own and runs the tests they are meant for.
#   scripts/sanitize.sh asan [core|all] [-- CTEST ARGS...]
#       ASan + UBSan (build-asan/). core: the libtorch-free tests - store, launcher, launch
#       options, engine environment, the fuzz targets' replays (minutes to build). all: also the
#       unit, distributor and data tests, which build libdtrain with the sanitizers (an hour
#       of CPU).
#   scripts/sanitize.sh tsan [core|all] [-- CTEST ARGS...]
#       TSan (build-tsan/). core: the store's server thread against its clients. all: also the
#       shared-memory backend, the Horovod controller, the elastic agents, the Tuner and the
#       data reader's threads.
# Every report fails the run (halt_on_error); a report inside a library we do not build
# (libtorch, Gloo, OpenMP) is suppressed in tests/sanitizers/*.supp with the report that
# justifies it, never one in dtrain's code. docs/hardening.md has the results.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kind="${1:-}"
scope="${2:-core}"
shift $(($# >= 2 ? 2 : $#))
[[ "${1:-}" == "--" ]] && shift
case "$kind" in
  asan) build="${DTRAIN_SANITIZE_BUILD:-$here/build-asan}"
        flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" ;;
  tsan) build="${DTRAIN_SANITIZE_BUILD:-$here/build-tsan}"
        flags="-fsanitize=thread" ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac

# Test names (ctest -R) and the targets that build them.
core_tests='(^|[./])(StoreTest|StoreTokenTest|FuzzReplay|ForkServer|Layout|OutputStream|ParseRunArgs|RendezvousTest|ValidateLaunchOptions|AgentSignalTest|BadInputTest|LauncherTest|DerivedPort|EngineTask|HostFile|HostList|Hostlist|RunUnderSlurm)\.'
core_targets=(store_test launch_options_test launcher_test engine_env_test
              fuzz_store_server_replay fuzz_store_client_replay fuzz_deepspeed_config_replay
              fuzz_engine_env_replay fuzz_hostfile_replay fuzz_forkserver_spec_replay
              fuzz_mlflow_response_replay)
if [[ "$kind" == tsan ]]; then
  core_tests='^(StoreTest|StoreTokenTest)\.'
  core_targets=(store_test)
fi
tests="$core_tests"
targets=("${core_targets[@]}")
if [[ "$scope" == all ]]; then
  if [[ "$kind" == asan ]]; then
    tests="$core_tests|(^|[./])(Codec[A-Za-z]*|Collectives[A-Za-z]*|Ddp[A-Za-z]*|Sampler[A-Za-z]*|Checkpoint[A-Za-z]*|SyncBatchNorm[A-Za-z]*|ShmGroup[A-Za-z]*|Distributor[A-Za-z]*|DataReader|DataTable|DataErrors|DeltaTable)\."
    targets+=(codec_test collectives_test shm_collectives_test shm_group_test ddp_test
              sampler_test checkpoint_test sync_batch_norm_test distributor_test
              distributor_driver_test fuzz_codec_replay fuzz_elastic_commit_replay
              data_test abandoning_worker dtrain_cli)
  else
    tests="$core_tests|(^|[./])(ShmGroup[A-Za-z]*|Hvd[A-Za-z]*|Horovod[A-Za-z]*|Elastic[A-Za-z]*|Tune[A-Za-z]*|Tuner[A-Za-z]*|DataReader|DataTable|DataErrors|DeltaTable)\."
    targets+=(shm_group_test shm_collectives_test hvd_test elastic_test tune_tuner_test
              data_test abandoning_worker dtrain_cli)
  fi
elif [[ "$scope" != core ]]; then
  echo "sanitize.sh: scope is 'core' or 'all', got '$scope'" >&2
  exit 2
fi

# The venv scripts/setup.sh made (not re-made here: this tree needs only its path).
venv_python="${DTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dtrain/venv}/bin/python"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g $flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$flags" -DDTRAIN_BUILD_BENCH=OFF \
    -DDTRAIN_VENV_PYTHON="$venv_python" \
    "-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$here;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_COMPILERCHECK=content;ccache" \
    >/dev/null
fi
cmake --build "$build" -j "$(nproc)" -t "${targets[@]}"

supp="$here/tests/sanitizers"
# verify_asan_link_order=0: the fork-server tests preload libdtrain_forkserver.so ahead of
# libasan into ASan-built workers; the preload uses libc only, so the order is harmless.
# handle_segv=0: the launcher tests crash workers with SIGSEGV on purpose and check that the
# agent reports the signal; ASan's own handler would turn that death into an abort (exit 134).
# Bad accesses are still caught by the instrumentation before they fault.
export ASAN_OPTIONS="detect_leaks=1:verify_asan_link_order=0:halt_on_error=1:abort_on_error=1:handle_segv=0"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
cd "$build"
# Not the fork server's tests: it declines sanitizer-built programs by design (a sanitizer
# runtime must be loaded first and intercepts fork; src/launch/fork_server.cpp), so workers
# here are exec'd and those tests' premise does not hold. The normal suite runs them.
not_here='(^forkserver\.)|ForkServer|ForkedWorker|WhileLoading'
ctest -R "$tests" -E "$not_here" --output-on-failure "$@"
