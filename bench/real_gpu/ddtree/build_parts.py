"""The DDTree fork's GPU environment, as parts for the borrowed machine (issue 51): the same steps
as ``bench/real_gpu/build_parts.py`` (whose functions this drives, with its own folders and
roots), for the fork's set instead of 0.5.11's. Run here, with internet for ``pip download``:

    python -m bench.real_gpu.ddtree.build_parts --list    # the roots and pins, nothing built
    python -m bench.real_gpu.ddtree.build_parts           # build, then print the device calls
    python -m bench.real_gpu.ddtree.build_parts --check   # check what is built, print the calls

The fork (github:DB-Guo/sglang-ddtree-dev, branch feature/ddtree-dev, commit 514ea1f3e) pins
SGLang 0.5.13's set, read from its own ``python/pyproject.toml`` in the shared fixture tarball:
``sglang-kernel==0.4.3``, ``flashinfer_python[cu13]==0.6.12``, ``transformers==5.8.1``,
``torch==2.11.0`` (the device image's torch 2.11.0+cu130: not carried). The fork is no wheel: its
pyproject builds a Rust extension from ``../rust`` (not on the HTTP server's path), so its
``python/sglang`` is laid into ``site312`` beside a ``sglang-0.0.0.dev0.dist-info``, as the
fixture's README says (``tests/harness/sources.lay_ddtree_fork``, the one way it is laid in).

Outputs under ``build/real_gpu_ddtree/`` (``wheels``, ``kernel`` and ``site312`` parts) and
``.ddcarry1..N`` at the repository root (git-ignored), the last one the run call's: the zstandard
wheel and ``COMMIT``. Never run on this machine by the tests (a ~2 GB download).
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: pip's own copy
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

from bench.real_gpu import build_parts as bp
from tests.harness.sources import DDTREE_FORK_TARBALL, lay_ddtree_fork

BUILD = bp.ROOT / "build" / "real_gpu_ddtree"
# Its own carried folders and parts folder on the machine: never the 0.5.11 lab's (.carryN,
# /root/parts), whose parts have the same names.
CARRY, MACHINE_PARTS = ".ddcarry", "/root/parts-ddtree"
# The tools drive.py runs with the server's interpreter, as build_parts' ROOTS has them.
TOOLS = [r for r in bp.ROOTS if not r.startswith("sglang==")]
# The fork's pins that a --no-deps walk must keep (its pyproject's, 0.5.13's set).
FORK_PINS = ("sglang-kernel", "flashinfer-python", "transformers", "torch")


def fork_requirements() -> list[str]:
    """The fork's ``[project] dependencies``, from its pyproject.toml in the fixture tarball."""
    with tarfile.open(DDTREE_FORK_TARBALL) as tar:
        member = tar.extractfile("python/pyproject.toml")
        if member is None:
            raise SystemExit(f"{DDTREE_FORK_TARBALL} has no python/pyproject.toml")
        project = tomllib.loads(member.read().decode())["project"]
    return list(project["dependencies"])


def roots_and_pins() -> tuple[list[str], dict[str, str]]:
    reqs = fork_requirements()
    pins: dict[str, str] = {}
    for line in reqs:
        req = bp.Requirement(line)
        name = bp.canonicalize_name(req.name)
        if name in FORK_PINS:
            pins[name] = str(req.specifier)
    missing = [n for n in FORK_PINS if n not in pins]
    if missing:
        raise SystemExit(f"the fork's pyproject pins none of {missing}: not the tree at 514ea1f3e")
    return reqs + TOOLS, pins


def configure() -> None:
    """Point build_parts at this build: its folders, roots and pins, the calls it prints."""
    roots, pins = roots_and_pins()
    bp.BUILD, bp.WHEELS, bp.PARTS = BUILD, BUILD / "wheels", BUILD / "parts"
    # sgl-deep-gemm 0.1.2 pins apache-tvm-ffi==0.1.9 and nvidia-cudnn-frontend >= 1.30 asks
    # >=0.1.11 outside any extra: the walk has no resolver, so take the newest frontend that
    # asks tvm-ffi only under its extras (1.28.0; 1.29.1 asks >=0.1.11 too, read from METADATA).
    pins["nvidia-cudnn-frontend"] = "==1.28.0"
    bp.ROOTS, bp.PINS = roots, pins
    bp.calls = calls
    bp.CARRY_PREFIX, bp.MACHINE_PARTS = CARRY, MACHINE_PARTS


def run_folder(wheels: dict[str, Path]) -> list[Path]:
    """The run call's own files: zstandard (the device may have no zstd) and COMMIT."""
    out = BUILD / "run"
    out.mkdir(parents=True, exist_ok=True)
    zst = wheels.get("zstandard") or next(bp.WHEELS.glob("zstandard-*.whl"), None)
    if zst is None:
        bp.sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(bp.WHEELS),
               *bp.PIP_TARGET, "zstandard"])
        zst = next(bp.WHEELS.glob("zstandard-*.whl"))
    (out / zst.name).write_bytes(zst.read_bytes())
    head = bp.subprocess.run(["git", "rev-parse", "HEAD"], cwd=bp.ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
    (out / "COMMIT").write_text(head + "\n")
    return sorted(out.iterdir())


def calls(n: int) -> str:
    lines = bp.parts_calls(n)
    folder = f"{CARRY}{n}"
    run = (f"run(command='CARRY={folder} bash bench/real_gpu/ddtree/lab_ddtree.sh'"
           f", carry=['{folder}'], timeout_s=600)")
    lines.append(f"  {n}. {run}")
    lines.append(f"  {n + 1}.. the same call again at once while the record says servers are left "
                 "(it resumes from ddtree-record.json; the venv is kept on the warm machine; "
                 "a fresh machine needs calls 1.."
                 f"{n - 1} first, and goes on from an earlier session's record where its last "
                 f"real_gpu.tar.gz is put in {folder}). Each call returns $OUT/real_gpu.tar.gz "
                 "and $OUT/run.log.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the roots and pins, build nothing")
    ap.add_argument("--check", action="store_true", help="check the built folders, print the calls")
    args = ap.parse_args(argv)
    configure()
    if args.list:
        print("roots:\n" + "\n".join(f"  {r}" for r in bp.ROOTS))
        print("pins:\n" + "\n".join(f"  {n}{s}" for n, s in sorted(bp.PINS.items())))
        return 0
    tree = bp.tree_bytes()
    if args.check:
        return bp.check(tree)
    wheels = bp.resolve()
    say = bp.say
    say(f"{len(wheels)} wheels: {' '.join(sorted(p.name for p in wheels.values()))}")
    site = bp.install("site312", [p for n, p in wheels.items()
                                  if n not in ("sglang-kernel", "zstandard")])  # fmt: skip
    if not (site / "sglang-0.0.0.dev0.dist-info").is_dir():
        lay_ddtree_fork(site)
        say(f"the fork's python/sglang laid into {site} (sglang-0.0.0.dev0.dist-info)")
    parts = (bp.pack("kernel", bp.install("kernel", [wheels["sglang-kernel"]]), bp.PART_BYTES)
             + bp.pack("site312", site, bp.PART_BYTES))
    bins = bp.carry(parts, run_folder(wheels), bp.PART_BYTES)
    say(f"{len(bins)} carry folders")
    return bp.check(tree)


if __name__ == "__main__":
    if not re.fullmatch(r"bench\.real_gpu\.ddtree\.build_parts", __spec__.name if __spec__ else ""):
        sys.exit("run it as: python -m bench.real_gpu.ddtree.build_parts")
    sys.exit(main())
