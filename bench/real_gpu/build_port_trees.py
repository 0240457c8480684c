"""Builds the PR#20547-port trees the real-GPU run compares, through the port's recipe
(``tests/harness/port_build.py``: the one way the port's files are made outside a deploy), as
small tarballs of the files each build writes (run here, before the run; the tarballs travel in
the carried folder and are unpacked over a copy of the stock 0.5.11 tree on the machine).

- ``port-fixed.tar.gz``: ``build_fixed()``, the port as main ships it (the recipe, verify-mask
  fix included);
- ``port-stale-mask.tar.gz``: ``build_stale_mask()``, the same recipe less its verify-mask fix
  (0.5.11's own ``dflash_utils.py`` kept): isolates the mask, everything else as fixed;
- ``port-rope.tar.gz`` (only where the fixed build writes ``models/dflash.py``): that file alone,
  the drafter-RoPE patch over stock 0.5.11 (DFLASH v1);
- ``port-unfixed.tar.gz``: ``build_unfixed(site)``, the port as it was before issue #29 (commit
  ``UNFIXED_COMMIT``: stale mask under triton, and the other bugs #29 fixed).

Each tarball holds every file any of the three builds writes, so that unpacking one over the
stock tree leaves no file of another build behind (a file a build does not change is the wheel's).

Usage: python bench/real_gpu/build_port_trees.py WHEEL_0_5_11 OUTDIR
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.harness import port_build  # noqa: E402

# The drafter's RoPE patch (the port issue's): where the fixed build writes it, ``port-rope``
# is that file alone over the stock tree, so stock 0.5.11's DFLASH v1 runs with it.
ROPE_FILE = "sglang/srt/models/dflash.py"


def main(wheel_511: str, outdir: str) -> None:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel_511) as whl:
        site = Path(tmp)
        for name in whl.namelist():
            if name.startswith("sglang/"):
                whl.extract(name, site)
        bad = port_build.check_site(site, port_build.load_recipe())
        if bad:
            raise SystemExit(f"{wheel_511} is not the 0.5.11 wheel the recipe pins: {bad}")
        stale = port_build.build_stale_mask()
        stale.pop(port_build.MASK_FILE, None)  # 0.5.11's own file: the stale mask
        builds = {"fixed": port_build.build_fixed(), "stale-mask": stale,
                  "unfixed": port_build.build_unfixed(site)}
        if ROPE_FILE in builds["fixed"]:  # the port's drafter-RoPE patch, alone over stock (v1)
            builds["rope"] = {ROPE_FILE: builds["fixed"][ROPE_FILE]}
        every = sorted(set().union(*builds.values()))
        record: dict = {"made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "how": "tests/harness/port_build.py: build_fixed(), build_stale_mask() "
                               "(less MASK_FILE), build_unfixed(site of the 0.5.11 wheel)",
                        "unfixed_commit": port_build.UNFIXED_COMMIT,
                        "mask_file": port_build.MASK_FILE, "wheel": Path(wheel_511).name,
                        "builds": {}}
        for name, files in builds.items():
            tree = {p: files[p] if p in files else (site / p).read_text()
                    for p in every if p in files or (site / p).is_file()}
            with tarfile.open(out / f"port-{name}.tar.gz", "w:gz") as t:
                for path, text in sorted(tree.items()):
                    dest = site.parent / f"{site.name}-{name}" / path
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_text(text)
                    t.add(dest, arcname=path)
            record["builds"][name] = {
                "written_by_build": sorted(files),
                "sha256": {p: hashlib.sha256(t.encode()).hexdigest()
                           for p, t in sorted(tree.items())},
            }
    (out / "port-trees.json").write_text(json.dumps(record, indent=1) + "\n")
    mask = {n: b["sha256"].get(port_build.MASK_FILE, "")[:12] for n, b in record["builds"].items()}
    print(json.dumps({"files": len(every), "mask_file_sha256": mask}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
