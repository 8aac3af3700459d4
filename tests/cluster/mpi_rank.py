# A Python program run by the Distributor's program mode on an MPI engine (not executable on
# purpose: it must be run through python3). It takes its rank from the MPI launcher.
import os
import sys

rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
# One write for the whole line: the MPI launcher merges the ranks' output as it comes, and under
# python3 -u print() writes the text and its newline separately.
sys.stdout.write(f"py rank={rank} python={sys.version_info.major}\n")
sys.stdout.flush()
