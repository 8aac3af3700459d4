#!/usr/bin/env python3
"""Peak RSS per rank by ZeRO stage, dtrain against DeepSpeed itself, in one run: for each world
size, stage and zero_optimization variant, `dtrain run ... zero_bench rss-worker` and
`torchrun ... bench/zero_deepspeed_rss.py` (the same model, batch, loss, steps and
measurement - VmHWM after resetting it past initialize), one fresh launch each, interleaved.
Prints each figure, each stage's ratio to the same system's stage 0, dtrain's peak over
DeepSpeed's, and writes them with the machine as JSON (--json).

    python3 bench/zero_rss_vs_deepspeed.py --build-dir build [--worlds 2,4]
        [--variants defaults,deepspeed_fetch,eager_release] [--json out.json]

variants: defaults (each system's own defaults but the stage - they differ in two stage-3 keys,
stage3_max_reuse_distance (dtrain 0, DeepSpeed 1e9) and stage3_prefetch_bucket_size (5e6, 5e7));
deepspeed_fetch (stage 3 with DeepSpeed's values of the two, for both); eager_release (stage 3
with both at 0: each layer gathered when used and released after). OMP_NUM_THREADS=1 for both
(torchrun's default for several processes)."""
import argparse
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = {"defaults": "",
            "deepspeed_fetch": '{"stage3_max_reuse_distance": 1000000000, "stage3_prefetch_bucket_size": 50000000}',
            "eager_release": '{"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}'}


def last_rss_json(text):
    lines = [l[l.index("{"):] for l in text.splitlines() if '"bench"' in l and "zero_rss" in l]
    if not lines:
        raise RuntimeError("no zero_rss line in:\n" + text[-3000:])
    return json.loads(lines[-1])


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return last_rss_json(r.stdout + r.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--torchrun", default=os.path.join(os.path.dirname(sys.executable), "torchrun"))
    ap.add_argument("--worlds", default="2")
    ap.add_argument("--variants", default="defaults,deepspeed_fetch,eager_release")
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--json")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    dtrain = os.path.join(a.build_dir, "tools", "dtrain")
    zero_bench = os.path.join(a.build_dir, "bench", "zero_bench")
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    out = {"machine": {"cpu": cpu, "cores": os.cpu_count(), "host": platform.node(),
                       "load": os.getloadavg()[0]}, "rows": []}
    print("machine:", out["machine"], flush=True)
    for world in a.worlds.split(","):
        stage0 = {}
        for variant in a.variants.split(","):
            zero = VARIANTS[variant]
            for stage in map(int, a.stages.split(",")):
                if variant != "defaults" and stage != 3:
                    continue  # the variant's keys are read by stage 3 only
                extra = ["--zero", zero] if zero else []
                d = run([dtrain, "run", "--nproc-per-node", world, zero_bench, "rss-worker", "--stage", str(stage)]
                        + extra, env)
                s = run([a.torchrun, "--nproc-per-node", world, "--monitor-interval", "0.1",
                         os.path.join(HERE, "zero_deepspeed_rss.py"), "--stage", str(stage)] + extra, env)
                dp, sp = d["max_peak_rss_bytes"], s["max_peak_rss_bytes"]
                if stage == 0 and variant == "defaults":
                    stage0 = {"dtrain": dp, "deepspeed": sp}
                row = {"world": int(world), "stage": stage, "variant": variant, "dtrain_peak_mib": dp / 2**20,
                       "deepspeed_peak_mib": sp / 2**20, "dtrain_vs_stage0": dp / stage0["dtrain"],
                       "deepspeed_vs_stage0": sp / stage0["deepspeed"], "dtrain_over_deepspeed": dp / sp,
                       "deepspeed_rss_before_model_mib": max(s["rss_before_model_bytes"]) / 2**20,
                       "dtrain_every_rank_mib": [v / 2**20 for v in d["peak_rss_bytes"]],
                       "deepspeed_every_rank_mib": [v / 2**20 for v in s["peak_rss_bytes"]]}
                out["rows"].append(row)
                print(f"{world} ranks, stage {stage} ({variant}): dtrain {row['dtrain_peak_mib']:.0f} MiB "
                      f"({row['dtrain_vs_stage0']:.2f}x its stage 0), DeepSpeed {row['deepspeed_peak_mib']:.0f} MiB "
                      f"({row['deepspeed_vs_stage0']:.2f}x its stage 0; {row['deepspeed_rss_before_model_mib']:.0f} "
                      f"MiB before the model) -> dtrain/DeepSpeed {row['dtrain_over_deepspeed']:.2f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
