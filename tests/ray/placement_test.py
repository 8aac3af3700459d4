"""dtrain.ray's feasibility check and slot count (no cluster): whether a placement group of
bundles fits nodes of given total resources under each strategy, and how many processes of a
size the nodes hold. Run: python placement_test.py PYTHON_DIR (exit 0, or an assertion)."""

import sys

sys.path.insert(0, sys.argv[1])
from dtrain.ray import placeable, slots  # noqa: E402

two_by_two = [{"CPU": 2.0}, {"CPU": 2.0}]
head = {}  # a head node with 0 CPUs, as the tests' cluster has
cpu = lambda n: [{"CPU": 2.0}] * n

# STRICT_SPREAD: one bundle per node.
assert placeable([head] + two_by_two, cpu(2), "STRICT_SPREAD")
assert not placeable([head] + two_by_two, cpu(3), "STRICT_SPREAD")
assert not placeable([{"CPU": 4.0}], cpu(2), "STRICT_SPREAD")
# PACK and SPREAD: anywhere it fits, several bundles per node.
assert placeable([head, {"CPU": 4.0}], cpu(2), "PACK")
assert placeable([head] + two_by_two, [{"CPU": 1.0}] * 4, "SPREAD")
assert not placeable([head] + two_by_two, [{"CPU": 1.0}] * 5, "PACK")
# Bundles that fit the sum but no single node.
assert not placeable(two_by_two, [{"CPU": 3.0}], "PACK")
# STRICT_PACK: everything on one node.
assert placeable([{"CPU": 4.0}], cpu(2), "STRICT_PACK")
assert not placeable(two_by_two, cpu(2), "STRICT_PACK")
# GPUs count as well as CPUs.
assert placeable([{"CPU": 8.0, "GPU": 2.0}], [{"CPU": 1.0, "GPU": 1.0}] * 2, "PACK")
assert not placeable([{"CPU": 8.0, "GPU": 1.0}], [{"CPU": 1.0, "GPU": 1.0}] * 2, "PACK")
assert not placeable([{"CPU": 8.0}], [{"CPU": 1.0, "GPU": 1.0}], "PACK")
# Fractional CPUs.
assert placeable([{"CPU": 1.0}], [{"CPU": 0.5}] * 2, "PACK")

# Slots: processes of a size, each on one node.
assert slots([head] + two_by_two, {"CPU": 1.0}) == 4
assert slots([head] + two_by_two, {"CPU": 2.0}) == 2
assert slots([head, {"CPU": 3.0}], {"CPU": 2.0}) == 1
assert slots([{"CPU": 8.0, "GPU": 2.0}], {"CPU": 1.0, "GPU": 1.0}) == 2
assert slots([{"CPU": 8.0}], {"CPU": 1.0, "GPU": 1.0}) == 0
assert slots([{"CPU": 1.0}], {"CPU": 0.5}) == 2
print("ok: placement and slots")
