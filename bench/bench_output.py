"""What the benchmarks read from the programs they run (imported by the bench/*.py scripts)."""

import json


def last_json(text):
    """The last line of `text` that holds a JSON object (from its first '{'), parsed.

    The examples print their result as one JSON line after their progress lines; a rank prefix
    such as "[default0]:" before the brace is skipped. Raises RuntimeError with the output's tail
    when no line parses."""
    for line in reversed(text.splitlines()):
        brace = line.find("{")
        if brace >= 0:
            try:
                return json.loads(line[brace:])
            except json.JSONDecodeError:
                continue
    raise RuntimeError("no JSON result in the output:\n" + text[-2000:])
