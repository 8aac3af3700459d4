#!/usr/bin/env bash
# Every C++ source of the repository is formatted as .clang-format says (clang-format 14,
# Debian 12's, which scripts/setup.sh installs). Prints the files that differ and how to fix them.
#   check_format.sh SOURCE_DIR
set -uo pipefail
src="${1:?usage: check_format.sh SOURCE_DIR}"
cd "$src" || exit 1
command -v clang-format >/dev/null || { echo "FAIL: clang-format is missing: scripts/setup.sh installs it" >&2; exit 1; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.h' '*.hpp' '*.cc')
((${#files[@]})) || { echo "FAIL: no C++ sources found under $src (not a git checkout?)" >&2; exit 1; }
bad=()
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "FAIL: ${#bad[@]} of ${#files[@]} files are not formatted as .clang-format says:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix: clang-format -i ${bad[*]}" >&2
  exit 1
fi
echo "ok: ${#files[@]} C++ sources formatted ($(clang-format --version))"
