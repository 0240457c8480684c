"""facts.sglang.SourceTreeKey: the content of an SGLang source tree, as one sha256, and the key
``sglang.installed`` recorded when it last built SGLang from a tree into the venv.

argv[1]: the tree (``sglang.source_path``); argv[2]: the venv's record file. Run by the system
python3 with -I -S; reads files, runs nothing of the tree. Each entry, in path order: a regular
file's path, executable bit and content sha256, a symlink's path and target. Left out: what a
build writes into the tree (``build/``, ``dist/``, ``.eggs/`` and ``*.egg-info/`` at its top,
``__pycache__/`` and ``*.pyc`` anywhere) and ``.git/``: a rebuild leaves the key as it was.
Prints the Python literal ``{"sha256": HEX or None (no such folder), "files": N,
"recorded": TEXT or None}``."""

import hashlib
import os
import stat
import sys

root, record = sys.argv[1], sys.argv[2]
SKIP_TOP = ("build", "dist", ".eggs")
SKIP_ANY = (".git", "__pycache__")
out = {"sha256": None, "files": 0, "recorded": None}
try:
    with open(record, encoding="utf-8") as f:
        out["recorded"] = f.read(4096)
except (OSError, UnicodeDecodeError):
    pass


def entry(path, rel):
    st = os.lstat(path)
    name = rel.encode("utf-8", "surrogateescape")
    if stat.S_ISLNK(st.st_mode):
        return b"l " + name + b"\0" + os.fsencode(os.readlink(path))
    if not stat.S_ISREG(st.st_mode):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    mode = b"x" if st.st_mode & 0o111 else b"-"
    return b"f" + mode + b" " + name + b"\0" + h.hexdigest().encode()


if os.path.isdir(root):
    total = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        keep, names = [], list(files)
        for d in dirs:
            if d in SKIP_ANY or rel == "." and (d in SKIP_TOP or d.endswith(".egg-info")):
                continue
            if os.path.islink(os.path.join(folder, d)):
                names.append(d)  # a link to a folder: its target, never followed
            else:
                keep.append(d)
        dirs[:] = sorted(keep)
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            shown = os.path.normpath(os.path.join(rel, name))
            try:
                line = entry(os.path.join(folder, name), shown)
            except OSError as e:  # unreadable: its path and why, so that a change still shows
                line = b"? " + shown.encode("utf-8", "surrogateescape") + b"\0" + \
                    str(e.errno).encode()
            if line is not None:
                total.update(line + b"\n")
                out["files"] += 1
    out["sha256"] = total.hexdigest()
print(repr(out))
