"""facts.python.Packages: the interpreter's version and every installed distribution.
argv[1]: comma-separated names asked for; argv[2] (tests only): a directory searched first."""
# needs: installed_dists

import sys

if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
print(repr({"python": sys.version.split()[0], "names": sys.argv[1].split(","),
            "dists": installed_dists(sys.path)}))
