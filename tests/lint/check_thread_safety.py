#!/usr/bin/env python3
"""The lock annotations (src/core/thread_annotations.h) hold: the annotated sources compile with
clang -fsyntax-only -Wthread-safety -Werror=thread-safety, with the flags the build gives them
(compile_commands.json; GCC's precompiled header left out, libtorch's headers parsed once into
a clang PCH). Registered for the libtorch 2.x build only: clang 14 does not parse 1.13's
headers in C++20.
Usage: check_thread_safety.py BUILD_DIR [SOURCE...] (default: SOURCES below). Exit code 1 prints clang's diagnostics."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

# The sources whose classes hold annotated mutexes (keep this list to those: each libtorch one
# costs ~2 s of CPU with the PCH).
SOURCES = [
    "src/timeline/timeline.cpp",
    "src/tracking/mlflow_run.cpp",
    "src/core/driver_service.cpp",
    "src/horovod/controller.cpp",
    "src/horovod/horovod.cpp",
    "src/comm/shm/shm_group.cpp",
    "src/comm/process_group.cpp",
    "src/comm/staged/staged_backend.cpp",
    "src/diagnosis/monitor.cpp",
    "src/data/prefetch.cpp",
    "src/data/cache.cpp",
    "src/tune/search_space.cpp",
]
CLANG = "clang++"


def flags_of(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-include", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD", "-Winvalid-pch") or a == entry["file"] or a.endswith(".o"):
            continue
        out.append(a)
    return out


def main():
    if not shutil.which(CLANG):
        print(f"FAIL: {CLANG} is missing: scripts/setup.sh installs Debian's clang", file=sys.stderr)
        return 1
    build = sys.argv[1]
    sources = sys.argv[2:] or SOURCES
    with open(os.path.join(build, "compile_commands.json")) as f:
        db = json.load(f)
    src = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    by_file = {}
    for e in db:
        rel = os.path.relpath(os.path.realpath(os.path.join(e["directory"], e["file"])), src)
        by_file.setdefault(rel, e)
    missing = [s for s in sources if s not in by_file]
    if missing:
        print("FAIL: not in " + build + "/compile_commands.json: " + ", ".join(missing) +
              " (is CMAKE_EXPORT_COMPILE_COMMANDS on, and the list in this script current?)",
              file=sys.stderr)
        return 1
    checks = ["-fsyntax-only", "-Wno-everything", "-Wthread-safety", "-Werror=thread-safety"]
    failed = []
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        pch = None
        for rel in sources:
            e = by_file[rel]
            flags = flags_of(e)
            extra = []
            if any("torch/include" in a for a in flags):
                if pch is None:
                    pch = os.path.join(tmp, "torch.pch")
                    header = os.path.join(tmp, "torch_pch.h")
                    with open(header, "w") as h:
                        h.write("#include <torch/torch.h>\n")
                    r = subprocess.run([CLANG, *flags, "-Wno-everything", "-x", "c++-header",
                                        header, "-o", pch], cwd=e["directory"],
                                       capture_output=True, text=True)
                    if r.returncode != 0:
                        print("FAIL: clang cannot precompile torch/torch.h:\n" + r.stderr[-3000:],
                              file=sys.stderr)
                        return 1
                extra = ["-include-pch", pch]
            r = subprocess.run([CLANG, *flags, *extra, *checks, os.path.join(src, rel)],
                               cwd=e["directory"], capture_output=True, text=True)
            if r.returncode != 0:
                failed.append(rel + ":\n" + r.stderr[-6000:])
    if failed:
        print("FAIL: lock annotations do not hold (clang -Wthread-safety):\n\n" +
              "\n".join(failed), file=sys.stderr)
        return 1
    print(f"ok: {len(sources)} annotated sources pass clang -Wthread-safety "
          f"({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
