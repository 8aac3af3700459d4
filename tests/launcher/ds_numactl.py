"""DeepSpeed's own core binding for deepspeed_launcher_test: for each case of the JSON list in
the first argument ({"list": "0-3" | null, "procs": N, "local_rank": R, "numa": [[node 0's
CPUs], ...] | null}),
what deepspeed/utils/numa.py's get_numactl_cmd returns - [cores_per_rank, numactl command] - or
{"error": message} where it raises. One JSON object on stdout: {"cases": [...],
"physical_cores": psutil.cpu_count(logical=False), "numactl": whether numactl is installed}.

numa.py is loaded from the installed deepspeed package by its path, without importing deepspeed
(which imports torch: seconds the test does not need). A case's "numa" is what get_numa_cores()
returns (it runs `numactl --hardware`); "numa": null keeps DeepSpeed's own reading of the machine.
"""
import contextlib
import importlib.util
import json
import os
import shutil
import sys

spec = importlib.util.find_spec("deepspeed")
if spec is None or not spec.submodule_search_locations:
    sys.exit("ds_numactl.py: deepspeed is not installed in " + sys.executable)
path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "numa.py")
numa_spec = importlib.util.spec_from_file_location("ds_numa", path)
numa = importlib.util.module_from_spec(numa_spec)
numa_spec.loader.exec_module(numa)

import psutil  # noqa: E402  (DeepSpeed's count of physical cores)

own_numa_cores = numa.get_numa_cores
out = []
for case in json.loads(sys.argv[1]):
    numa.get_numa_cores = own_numa_cores if case["numa"] is None else (lambda c=case: c["numa"])
    try:
        # check_for_numactl_pkg() prints advice to stdout: keep it off our one line.
        with contextlib.redirect_stdout(sys.stderr):
            cores, cmd = numa.get_numactl_cmd(case["list"], case["procs"], case["local_rank"])
        out.append([cores, cmd])
    except (AssertionError, ValueError) as e:
        out.append({"error": str(e)})
print(json.dumps({"cases": out, "physical_cores": psutil.cpu_count(logical=False),
                  "numactl": shutil.which("numactl") is not None}))
