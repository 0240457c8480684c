"""facts.python.Packages: the interpreter's version and every installed distribution.
argv[1]: comma-separated names asked for; argv[2] (tests only): a directory searched first.
Run with -I -S: the site folders are found by ``site_paths``, no .pth file's code runs."""
# needs: installed_dists, site_paths

import sys

sys.path += [p for p in site_paths() if p not in sys.path]
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
print(repr({"python": sys.version.split()[0], "names": sys.argv[1].split(","),
            "dists": installed_dists(sys.path)}))
