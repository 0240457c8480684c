"""facts.weights.WeightsState: the revisions of one model root, each checked against its manifest.
argv[1]: the model root; argv[2] (any): also list the processes using each revision."""
# needs: pids_using

import json
import os
import sys

root = sys.argv[1]
want_in_use = len(sys.argv) > 2
out = {"path": root, "current": None, "revisions": {}}
if os.path.isdir(root):
    link = os.path.join(root, "current")
    if os.path.islink(link):
        out["current"] = os.path.basename(os.readlink(link).rstrip("/"))
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if os.path.islink(d) or not os.path.isdir(d):
            continue
        if len(name) != 40 or any(c not in "0123456789abcdef" for c in name):
            continue
        rev = {"complete": False, "files": 0, "bytes": 0, "changed": [], "missing": [],
               "in_use": pids_using(d) if want_in_use else []}
        try:
            with open(os.path.join(d, ".specfleet", "manifest.json")) as f:
                m = json.load(f)
        except (OSError, ValueError):
            m = None
        if m and m.get("revision") == name:
            rev["complete"] = bool(m.get("complete"))
            rev["files"] = len(m.get("files", {}))
            rev["bytes"] = int(m.get("bytes", 0))
            rev["verified_at"] = m.get("verified_at")
            rev["allow_patterns"] = m.get("allow_patterns")
            rev["ignore_patterns"] = m.get("ignore_patterns")
            for p, e in sorted(m.get("files", {}).items()):
                try:
                    st = os.stat(os.path.join(d, p))
                except OSError:
                    rev["missing"].append(p)
                    continue
                if (st.st_size != e.get("size") or st.st_mtime_ns != e.get("mtime_ns")
                        or e.get("ino", st.st_ino) != st.st_ino):
                    rev["changed"].append(p)
        out["revisions"][name] = rev
print(json.dumps(out))
