#!/usr/bin/env python3
"""Every relative link of README.md and docs/*.md resolves: the file (or folder) exists, and a
'#anchor' names a heading of its target as GitHub renders it. Links inside code (fenced blocks,
indented blocks, `spans`) are not links. Usage: check_links.py SOURCE_DIR. Exit code 1 names
each broken link with its file and line."""
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^()\s]+)\)")


def prose_lines(text):
    """(line number, line without code spans) of each line outside code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        if line.startswith("    ") or line.startswith("\t"):
            continue  # an indented code block (no list in these files nests that deep)
        yield n, re.sub(r"`[^`]*`", "", line)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    seen = {}
    out = set()
    with open(path, encoding="utf-8") as f:
        for _, line in prose_lines(f.read()):
            m = re.match(r"^(#{1,6}) +(.*?) *#*$", line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    broken = []
    count = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for n, line in prose_lines(text):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                count += 1
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                where = f"{os.path.relpath(path, root)}:{n}: '{target}'"
                if not os.path.exists(dest):
                    broken.append(f"{where}: {os.path.relpath(dest, root)} does not exist")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    broken.append(f"{where}: no heading of {os.path.relpath(dest, root)} has anchor #{anchor}")
    for b in broken:
        print(b)
    if broken:
        print(f"check_links: {len(broken)} of {count} relative links are broken; fix the path or the heading")
        return 1
    print(f"check_links: {count} relative links in {len(files)} files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
