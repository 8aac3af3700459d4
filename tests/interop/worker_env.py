# Prints, as one JSON line, this worker's whole environment, so that a test can compare what
# torchrun and `dtrain run` give their workers.
import json
import os

print(json.dumps({"rank": int(os.environ["RANK"]), "env": dict(os.environ)}), flush=True)
