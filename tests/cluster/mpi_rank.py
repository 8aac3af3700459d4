# A Python program run by the Distributor's program mode on an MPI engine (not executable on
# purpose: it must be run through python3). It takes its rank from the MPI launcher.
import os
import sys

rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
print(f"py rank={rank} python={sys.version_info.major}", flush=True)
