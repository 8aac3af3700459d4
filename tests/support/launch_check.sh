# `dtrain launch` through a cluster engine (tests/spark/spark_test.sh, tests/ray/ray_test.sh),
# sourced after `fail`, `on`, DTRAIN and T are defined:
#   check_dtrain_launch WHAT LOCAL_RANK_ARG FLAGS...
# runs `dtrain launch FLAGS... launch_args.py a` on host n0 (2 agents x 2 processes) and checks
# each of the 4 ranks' line: "--local-rank=N a" when LOCAL_RANK_ARG is 1 (no --use-env), "a"
# when 0, and LOCAL_RANK=N either way (N its local rank).
check_dtrain_launch() {
  local what=$1 with_arg=$2
  shift 2
  on n0 "$DTRAIN" launch "$@" "$(dirname "${BASH_SOURCE[0]}")/../interop/launch_args.py" a \
    >"$T/launch.out" 2>"$T/launch.err"
  local rc=$? r args
  [[ $rc -eq 0 ]] || { cat "$T/launch.out" "$T/launch.err" >&2; fail "$what: exit $rc"; }
  for r in 0 1 2 3; do
    args=a
    [[ $with_arg == 1 ]] && args="--local-rank=$((r % 2)) a"
    grep -Eq "^\[default$r\]:args $args LOCAL_RANK=$((r % 2))$" "$T/launch.out" ||
      { cat "$T/launch.out" "$T/launch.err" >&2; fail "$what: rank $r did not get '$args' and LOCAL_RANK=$((r % 2))"; }
  done
}
