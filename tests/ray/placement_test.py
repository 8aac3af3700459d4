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

# Where each bundle's workers stand (layout), against Ray Train's own numbering of the same
# workers (TorchTrainer's WorkerGroup._assign_worker_ranks and its CUDA_VISIBLE_DEVICES
# sharing, called on stand-in workers: one per process, each with its bundle's node and a
# share of its GPUs).
from dtrain.ray import layout  # noqa: E402
from ray.train.v2._internal.callbacks.accelerators import _get_visible_accelerator_ids_per_worker  # noqa: E402
from ray.train.v2._internal.execution.worker_group.worker import ActorMetadata  # noqa: E402
from ray.train.v2._internal.execution.worker_group.worker_group import WorkerGroup  # noqa: E402


class _Worker:
    def __init__(self, node, gpus):
        self.metadata = ActorMetadata(hostname=node, node_id=node, node_ip=node, pid=0,
                                      accelerator_ids={"GPU": gpus})
        self.resources = {"GPU": len(gpus)} if gpus else {"CPU": 1}
        self.distributed_context = None


def ray_train(nodes, gpus, per):
    """Ray Train's (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, CUDA_VISIBLE_DEVICES) of each
    process, the bundles' processes in bundle order."""
    workers = []
    for n, g in zip(nodes, gpus):
        share = len(g) // per
        workers += [_Worker(n, g[k * share:(k + 1) * share]) for k in range(per)]
    ranked = WorkerGroup._assign_worker_ranks(list(workers))
    visible = dict(zip(map(id, workers), _get_visible_accelerator_ids_per_worker(
        [w.metadata for w in workers], "GPU"))) if any(gpus) else {}
    out = []
    for w in workers:
        c = w.distributed_context
        out.append((c.world_rank, c.local_rank, c.local_world_size, c.node_rank, visible.get(id(w), "")))
    assert sorted(o[0] for o in out) == list(range(len(ranked)))
    return out


def dtrain_layout(nodes, gpus, per):
    out = []
    for agent, node, first, size, visible in layout(nodes, gpus, per):
        out += [(agent * per + k, first + k, size, node, visible) for k in range(per)]
    return out


cases = [
    (["a", "a"], [[], []], 1),                  # the audit's: 2 bundles of 1 on one node
    (["a"], [[]], 2),                           # 1 bundle of 2
    (["a", "b", "a", "b"], [[]] * 4, 1),        # PACK over 2 nodes, interleaved bundles
    (["b", "a", "a", "b"], [[]] * 4, 2),        # 2 processes per bundle
    (["a", "b", "c"], [[]] * 3, 2),             # STRICT_SPREAD
    (["a", "a"], [["1"], ["0"]], 1),            # GPUs: the bundle with GPU 0 first on its node
    (["a", "b", "a"], [["2", "3"], ["0", "1"], ["0", "1"]], 2),
]
for nodes, gpus, per in cases:
    ours, theirs = dtrain_layout(nodes, gpus, per), ray_train(nodes, gpus, per)
    assert ours == theirs, (nodes, gpus, per, ours, theirs)
# Bundle 0 stays agent 0 (its task picked the store's port on its node) without GPUs.
assert layout(["b", "a", "b"], [[]] * 3, 1)[0][:2] == (0, 0)
print("ok: layout as Ray Train numbers its workers")
