"""Reads a Tune cluster driver's output (argv[1]: lines "span ID start=T0 end=T1 ...", each
trial's first process start and last report, wall clock) and checks that exactly
argv[2] trials ran at once at the most, over argv[3] trials. Exits 1 saying what it found."""
import re
import sys

out, want, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spans = [(float(a), float(b)) for a, b in re.findall(r"^span \S+ start=([0-9.]+) end=([0-9.]+)", out, re.M)]
if len(spans) != count:
    sys.exit("expected %d trial spans, found %d: %s" % (count, len(spans), spans))
most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
if most != want:
    sys.exit("at most %d trial(s) ran at once, expected %d: %s" % (most, want, spans))
print("at most %d trials at once: %s" % (most, [(round(a % 1000, 1), round(b % 1000, 1)) for a, b in spans]))
