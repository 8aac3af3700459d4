"""The logs of tests/elastic/elastic_train_worker (LOG_DIR/attemptN_rankR.log), read by
tests/cluster/elastic_test.sh and scripts/soak.sh: what each attempt resumed from and trained
on, and whether every sample of every epoch was trained on exactly once."""
import collections
import os
import re


def read(log_dir):
    """attempt number -> {"resume": step, "world": size, "steps": {(step, epoch): [sample...]},
    "first": time of its first step}; resume/world/first are None where the log has no line."""
    att = collections.defaultdict(lambda: {"resume": None, "world": None, "steps": {}, "first": None})
    for name in os.listdir(log_dir):
        m = re.match(r"attempt(\d+)_rank(\d+)\.log$", name)
        if not m:
            continue
        a = att[int(m.group(1))]
        for line in open(os.path.join(log_dir, name)):
            f = line.split()
            if not f:
                continue
            if f[0] == "resume":
                a["resume"], a["world"] = int(f[1]), int(f[2])
            elif f[0] == "step":
                a["steps"].setdefault((int(f[1]), int(f[2])), []).extend(int(x) for x in f[3:])
            elif f[0] == "first_step":
                a["first"] = float(f[2])
    return att


def not_exactly_once(att, order, epochs, size, examples):
    """[(epoch, [(sample, times seen), ...up to `examples`])] for every epoch in which the
    attempts in `order` did not train on each of `size` samples exactly once; each attempt
    counts up to the step the next one resumed from (what it did after was redone)."""
    seen = collections.defaultdict(list)
    for i, n in enumerate(order):
        cutoff = att[order[i + 1]]["resume"] if i + 1 < len(order) else 1 << 60
        for (step, epoch), idx in att[n]["steps"].items():
            if step <= cutoff:
                seen[epoch].extend(idx)
    bad = []
    for epoch in range(epochs):
        if sorted(seen[epoch]) != list(range(size)):
            c = collections.Counter(seen[epoch])
            bad.append((epoch, [(i, c[i]) for i in range(size) if c[i] != 1][:examples]))
    return bad
