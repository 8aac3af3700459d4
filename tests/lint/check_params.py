#!/usr/bin/env python3
"""dtrain's environment variables are declared once (src/core/params.def) and read through
core/params.h:
  1. docs/environment.md's generated table is what params_table prints from the declarations;
  2. every DTRAIN_*/HOROVOD_* name in a string literal of src/, include/ or tools/ is declared;
  3. nothing outside src/core/params.cpp calls getenv on such a name (the files listed in
     GETENV_ALLOWED say why they may).
Usage: check_params.py SOURCE_DIR PARAMS_TABLE. Exit code 1 names each offence and its fix."""
import os
import re
import subprocess
import sys

# Files that read a declared variable with getenv themselves, and why.
GETENV_ALLOWED = {
    "src/launch/forkserver/preload.cpp": "libc only: preloaded before the C++ runtime",
    "src/comm/cuda/device_cuda.cpp": "the CUDA plugin's loader (GPU builds only)",
}
# Names that appear in messages but are no runtime variables of dtrain (build settings).
NOT_RUNTIME = {"DTRAIN_LIBTORCH"}
STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
NAME = re.compile(r"\b((?:DTRAIN|HOROVOD)_[A-Z0-9_]*[A-Z0-9])\b")
GETENV = re.compile(r'getenv\(\s*"((?:DTRAIN|HOROVOD)_[A-Z0-9_]+)"')


def main():
    src, tool = sys.argv[1], sys.argv[2]
    errors = []
    doc = os.path.join(src, "docs", "environment.md")
    if not os.access(tool, os.X_OK):
        print(f"check_params: {tool} is not built; build the params_table target first", file=sys.stderr)
        return 1
    r = subprocess.run([tool, "--check", doc], capture_output=True, text=True)
    if r.returncode != 0:
        errors.append(r.stderr.strip() or r.stdout.strip())
    declared = set(subprocess.run([tool, "--names"], capture_output=True, text=True,
                                  check=True).stdout.split())
    for top in ("src", "include", "tools"):
        for root, _, files in os.walk(os.path.join(src, top)):
            for f in files:
                if not f.endswith((".cpp", ".h", ".hpp", ".cc")):
                    continue
                path = os.path.join(root, f)
                rel = os.path.relpath(path, src)
                if rel == "src/core/params.h":
                    continue
                with open(path, encoding="utf-8") as fh:
                    lines = fh.read().split("\n")
                for n, line in enumerate(lines, 1):
                    code = line
                    for lit in STRING.findall(code):
                        for name in NAME.findall(lit):
                            if name not in declared and name not in NOT_RUNTIME:
                                errors.append(f"{rel}:{n}: {name} is not declared: add it to "
                                              "src/core/params.def (and regenerate "
                                              "docs/environment.md)")
                    m = GETENV.search(line)
                    if m and rel != "src/core/params.cpp" and rel not in GETENV_ALLOWED:
                        errors.append(f"{rel}:{n}: getenv(\"{m.group(1)}\"): read it through "
                                      "core/params.h (param::k....get())")
    if errors:
        print("FAIL:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    print(f"ok: {len(declared)} variables declared, documented and read through core/params.h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
