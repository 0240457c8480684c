"""facts.sglang.SGLangInstall: the files of the installed SGLang that the parser reads, never
importing it (find_spec locates the package without running its __init__, which imports torch).
argv[1]: the request (``collect_request``); argv[2] (tests only): a directory to search first.
Prints the Python literal of what it found (``None`` without SGLang)."""
# needs: installed_dists, dist_version

import importlib.util as iu
import os
import sys

req = {"dirs": [], "texts": [], "lines": {}}
for row in sys.argv[1].split("\n"):
    kind, *rest = row.split("\t")
    if kind == "line":
        req["lines"][rest[0]] = rest[1:]
    elif kind in ("dir", "text"):
        req[kind + "s"].append(rest[0])
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
try:
    spec = iu.find_spec("sglang")
except (ImportError, ValueError):
    spec = None
locs = list(spec.submodule_search_locations or []) if spec else []
if not locs:
    print(None)
    sys.exit(0)
loc = locs[0]
version = dist_version(sys.path, "sglang")
def read(rel):
    try:
        with open(os.path.join(loc, rel), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
out = {"location": loc, "dist_version": version, "dirs": {}, "texts": {}, "lines": {}}
for rel in req["dirs"]:
    path = os.path.join(loc, rel)
    out["dirs"][rel] = sorted(os.listdir(path)) if os.path.isdir(path) else None
for rel in req["texts"]:
    out["texts"][rel] = read(rel)
for rel, needles in req["lines"].items():
    text = read(rel)
    out["lines"][rel] = None if text is None else [
        line for line in text.splitlines() if any(n in line for n in needles)
    ]
print(repr(out))
