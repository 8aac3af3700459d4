# A training script as Spark's DeepspeedTorchDistributor (or dtrain's DeepSpeedDistributor)
# starts it: writes its arguments, and the JSON of the file after --deepspeed_config if any, to
# $DS_ARGV_OUT/<RANK>.json.
import json
import os
import sys

args = sys.argv[1:]
config = None
if "--deepspeed_config" in args:
    with open(args[args.index("--deepspeed_config") + 1]) as f:
        config = json.load(f)
with open(os.path.join(os.environ["DS_ARGV_OUT"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"argv": args, "config": config}, f)
