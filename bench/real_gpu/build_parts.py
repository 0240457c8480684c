"""Builds everything the borrowed GPU machine needs for a real-GPU run, in one command (run here,
with internet for ``pip download``; idempotent: a step whose output is there is skipped):

    python -m bench.real_gpu.build_parts            # build, then print the device calls
    python -m bench.real_gpu.build_parts --check    # only check what is built and print the calls

1. ``build/real_gpu/wheels``: the cp312 / manylinux wheels of SGLang 0.5.11's set, resolved here
   from the wheels' own ``Requires-Dist`` (markers evaluated for CPython 3.12 on x86-64 Linux),
   ``pip download --no-deps`` one level at a time, less what the device image already holds
   (torch 2.11.0+cu130 and its CUDA libraries, Python 3.12: ``/work/.library/device/KINDS.md``;
   an image package is carried anyway where a pin excludes the image's version, e.g. tokenizers
   for transformers 5.6.0), less the kernels of other GPUs (``EXCLUDE``), plus pyinfra 3.10.0
   and specfleet's own needs (``drive.py`` runs ``python -m pyinfra`` and ``specfleet.plan`` with
   the server's interpreter).
2. ``build/real_gpu/site312`` (every wheel but sglang-kernel, installed ``--target``) and
   ``build/real_gpu/kernel`` (sglang-kernel 0.4.2, 1.2 GB), each ``tar | zstd -12 --long=27``
   and split into parts of at most ``PART_BYTES`` (``NAME.tar.zst.NN``).
3. The port trees (``build_port_trees.py`` on the 0.5.11 wheel: fixed, stale-mask, unfixed;
   through ``tests/harness/port_build.py``, so the port recipe's fixes are in them), the
   ``zstandard`` wheel (the device may have no ``zstd``: ``unzstd.py``), ``COMMIT`` (this
   checkout's HEAD): the run call's own folder.
4. ``.carry1`` .. ``.carryN`` (git-ignored, at the repository root): the parts, packed so that
   each folder plus the working tree that travels with every call stays under the device's
   64 MiB; the last one is the run call's. The lab pair (``models/lab-*``) is tracked, so it
   travels with the tree.

Prints the exact device calls (``run`` with ``carry``), in order.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # pip's own copy
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]  # noqa: F401
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]
    from pip._vendor.packaging.version import Version  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "bench" / "real_gpu"
BUILD = ROOT / "build" / "real_gpu"
WHEELS = BUILD / "wheels"
PARTS = BUILD / "parts"
MiB = 1024 * 1024
CARRY_LIMIT = 64 * MiB  # the device's carry limit per call, the working tree included
# The working tree travels with every call: about 5 MiB of code and records, and the lab pair's
# safetensors (about 20 MiB, tracked). The parts are cut for a tree of up to TREE_ALLOWANCE, a
# fixed size (under the 60 MB), so that building again in another checkout (main, after
# the merges) keeps them; --check says where the tree outgrew it.
TREE_ALLOWANCE = 30 * MiB
PART_BYTES = CARRY_LIMIT - TREE_ALLOWANCE

# What the run needs, at the top: SGLang's release and the tools drive.py runs with its interpreter.
# dill: 0.5.11's sampling/sampling_batch_info.py imports sampling/custom_logit_processor.py, which
# imports dill at the top, and no Requires-Dist of the set names it.
ROOTS = ["sglang==0.5.11", "pyinfra==3.10.0", "click>=8", "huggingface_hub>=0.30", "packaging>=23",
         "pydantic>=2", "jinja2>=3", "rich>=13", "dill"]
# Pins the issue and runs 1-4 name (a --no-deps walk has no resolver: these keep one version).
PINS = {"sglang-kernel": "==0.4.2", "transformers": "==5.6.0", "flashinfer-python": "==0.6.8.post1",
        # the versions run 4's server ran with
        "tokenizers": "==0.22.2", "compressed-tensors": "==0.18.0",
        # sglang 0.5.11 asks plain `kernels`, and the walk takes the newest (0.19.1); transformers
        # 5.6.0 pins kernels<0.13,>=0.12.0 only under its extras, which the walk does not follow,
        # yet imports it whenever present (integrations/hub_kernels.py): 0.19.1's LayerRepository
        # raised "Either a revision or a version must be specified." and every server died on
        # import (run 5, call 1). 0.12.3 served (calls 2-4).
        "kernels": ">=0.12.0,<0.13"}
# Never carried: the image's torch and CUDA libraries, and kernels SGLang imports only for other
# GPUs or features a DFLASH text server never loads (run 4's server started without them).
EXCLUDE = {"torch", "torchvision", "torchaudio", "triton", "flashinfer-cubin", "flash-attn-4",
           "nvidia-cutlass-dsl", "quack-kernels", "datasets", "modelscope", "decord2", "av",
           "torchcodec", "py-spy", "build", "timm", "nvidia-ml-py"}
# (not IPython: sglang/__init__.py imports sglang/utils.py, which imports IPython.display)
KEEP_NVIDIA = {"nvidia-cudnn-frontend"}
# The image's own, whatever a wheel's pin says (mistral-common asks numpy<2.4 at install time;
# the image's torch and scipy are built against its numpy 2.5.2: a second numpy would shadow it).
IMAGE_ALWAYS = {"numpy"}
# The device image's packages (KINDS.md, "Python packages already there", read 2026-11-17) and
# the versions a session saw there; an image package is carried only where a pin excludes its
# version. Unknown versions are trusted.
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax
e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx
optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp""".split())
IMAGE_VERSIONS = {"huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                  "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2",
                  "transformers": "5.17.0", "torch": "2.11.0", "accelerate": "1.15.0"}
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "platform_release": "", "platform_version": "", "implementation_version": "3.12.3",
       "extra": ""}
PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
              "--abi", "cp312", "--abi", "abi3", "--abi", "none"] + [
    arg for n in (39, 38, 35, 34, 31, 28, 27, 24, 17)
    for arg in ("--platform", f"manylinux_2_{n}_x86_64")
] + ["--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64",
     "--platform", "linux_x86_64", "--platform", "any"]


def say(text: str) -> None:
    print(f"build_parts: {text}", flush=True)


def sh(cmd: list[str] | str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def wheel_name(path: Path) -> str:
    return canonicalize_name(path.name.split("-")[0])


def wheel_requires(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode())
    return msg.get_all("Requires-Dist") or []


# The image's packages the carried set needs (the rehearsal installs them as the image's stand-in).
IMAGE_NEEDS: dict[str, str] = {}


def carried(name: str, spec: SpecifierSet) -> bool:
    if name in EXCLUDE or (name.startswith("nvidia-") and name not in KEEP_NVIDIA):
        return False
    if name in IMAGE_ALWAYS:
        return False
    if name in IMAGE:
        seen = IMAGE_VERSIONS.get(name)
        return seen is not None and not spec.contains(Version(seen), prereleases=True)
    return True


def resolve() -> dict[str, Path]:
    """{name: wheel}: the walk over Requires-Dist, one ``pip download --no-deps`` per level."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    specs: dict[str, SpecifierSet] = {}
    for line in ROOTS:
        req = Requirement(line)
        specs[canonicalize_name(req.name)] = req.specifier
    for name, pin in PINS.items():
        specs[name] = SpecifierSet(pin)
    have: dict[str, Path] = {}
    why: dict[str, str] = {}
    IMAGE_NEEDS.clear()
    frontier = [n for n in specs if carried(n, specs[n])]
    IMAGE_NEEDS.update({n: str(specs[n]) for n in specs if n in IMAGE and n not in frontier})
    for level in range(12):
        if not frontier:
            break
        for whl in WHEELS.glob("*.whl"):
            n = wheel_name(whl)
            ver = whl.name.split("-")[1]
            if n in frontier and specs.get(n, SpecifierSet()).contains(ver, prereleases=True):
                have[n] = whl
        missing = [n for n in frontier if n not in have]
        if missing:
            say(f"level {level}: pip download {len(missing)}: {' '.join(sorted(missing))}")
            reqs = [f"{n}{specs.get(n, '')}" for n in sorted(missing)]
            sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(WHEELS),
                *PIP_TARGET, *reqs])
            for whl in WHEELS.glob("*.whl"):
                n = wheel_name(whl)
                if n in missing and specs.get(n, SpecifierSet()).contains(
                        whl.name.split("-")[1], prereleases=True):
                    have[n] = whl
        nxt = []
        for n in frontier:
            for line in wheel_requires(have[n]):
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate(ENV):
                    continue
                dep = canonicalize_name(req.name)
                merged = SpecifierSet(str(specs.get(dep, "")) + ("," if specs.get(dep) and
                                      str(req.specifier) else "") + str(req.specifier))
                if dep not in specs or str(merged) != str(specs[dep]):
                    specs[dep] = merged
                    why.setdefault(dep, n)
                    if dep in have and not merged.contains(have[dep].name.split("-")[1],
                                                           prereleases=True):
                        del have[dep]
                    if carried(dep, merged) and dep not in have and dep not in nxt:
                        nxt.append(dep)
                    elif dep in IMAGE and dep not in EXCLUDE and not dep.startswith("nvidia-"):
                        IMAGE_NEEDS[dep] = str(merged)
        frontier = nxt
    for n in list(have):  # one version of each (several may lie in the download folder)
        if not carried(n, specs.get(n, SpecifierSet())):
            del have[n]
    return have


def fingerprint(paths: list[Path]) -> str:
    return hashlib.sha256("\n".join(sorted(p.name for p in paths)).encode()).hexdigest()[:16]


def install(name: str, wheels: list[Path]) -> Path:
    """``pip install --target`` (no deps, no compile) of the given wheels; kept if made from the
    same wheels."""
    target = BUILD / name
    stamp = BUILD / f"{name}.stamp"
    fp = fingerprint(wheels)
    if target.is_dir() and stamp.is_file() and stamp.read_text() == fp:
        say(f"{name}: kept ({len(wheels)} wheels)")
        return target
    shutil.rmtree(target, ignore_errors=True)
    say(f"{name}: installing {len(wheels)} wheels --target {target}")
    sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
        "--ignore-requires-python",
        "--target", str(target), *PIP_TARGET, *map(str, wheels)])
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts point at this machine
    stamp.write_text(fp)
    return target


def pack(name: str, folder: Path, part_bytes: int) -> list[Path]:
    """``tar | zstd -12 --long=27`` split into NAME.tar.zst.NN of at most ``part_bytes``; kept if
    the folder's stamp and the part size are the ones packed."""
    PARTS.mkdir(parents=True, exist_ok=True)
    stamp = f"{(BUILD / f'{name}.stamp').read_text()} {part_bytes}"
    done = PARTS / f"{name}.packed"
    parts = sorted(PARTS.glob(f"{name}.tar.zst.*"))
    if done.is_file() and done.read_text() == stamp and parts:
        say(f"{name}: parts kept ({len(parts)})")
        return parts
    for p in parts:
        p.unlink()
    say(f"{name}: packing {folder}")
    sh(f"tar -C {folder} -cf - . | zstd -q -12 --long=27 -T0 | "
       f"split -d -a 2 -b {part_bytes} - {PARTS}/{name}.tar.zst.", shell=True)
    sh(f"cat {PARTS}/{name}.tar.zst.* | zstd -q -t --long=27", shell=True)
    done.write_text(stamp)
    return sorted(PARTS.glob(f"{name}.tar.zst.*"))


def tree_bytes() -> int:
    """What travels with every call: tracked files and untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return sum((ROOT / p).stat().st_size for p in out.decode().split("\0")
               if p and (ROOT / p).is_file())


def run_folder(wheels: dict[str, Path]) -> list[Path]:
    """The run call's own files: zstandard wheel, the port trees, COMMIT."""
    out = BUILD / "run"
    out.mkdir(parents=True, exist_ok=True)
    zst = wheels.get("zstandard")
    if zst is None:
        sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(WHEELS),
            *PIP_TARGET, "zstandard"])
        zst = next(WHEELS.glob("zstandard-*.whl"))
    shutil.copy2(zst, out / zst.name)
    port_stamp = out / "port-trees.stamp"
    fp = hashlib.sha256()
    for p in sorted((ROOT / "specfleet" / "patchdata" / "pr20547").rglob("*")) + [
            ROOT / "tests" / "harness" / "port_build.py", HERE / "build_port_trees.py"]:
        if p.is_file():
            fp.update(p.name.encode() + p.read_bytes())
    shared = Path(os.environ.get("SPECFLEET_SHARED") or ROOT.parent / "shared")
    if not (shared / "fixtures" / "sglang-pr20547").is_dir():
        raise SystemExit(f"build_parts: the port recipe reads its upstream text from "
                         f"{shared}/fixtures/sglang-pr20547, which is not there: set "
                         "SPECFLEET_SHARED to the shared/ folder (e.g. in a worktree)")
    if not (port_stamp.is_file() and port_stamp.read_text() == fp.hexdigest()):
        say("port trees: bench/real_gpu/build_port_trees.py (the port recipe)")
        sh([sys.executable, str(HERE / "build_port_trees.py"), str(wheels["sglang"]), str(out)],
           cwd=ROOT)
        port_stamp.write_text(fp.hexdigest())
    else:
        say("port trees: kept")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    (out / "COMMIT").write_text(head + "\n")
    return sorted(p for p in out.iterdir() if not p.name.endswith(".stamp"))


# The carried folders' names (``<prefix>1..N`` at the repository root, git-ignored) and the
# machine's parts folder: the DDTree build (ddtree/build_parts.py) sets its own, so that the two
# builds never replace each other's folders here or parts there.
CARRY_PREFIX = ".carry"
MACHINE_PARTS = "/root/parts"


def carry_folders() -> list[Path]:
    pattern = re.escape(CARRY_PREFIX) + r"\d+"
    return sorted((d for d in ROOT.glob(CARRY_PREFIX + "*")
                   if d.is_dir() and re.fullmatch(pattern, d.name)),
                  key=lambda d: int(d.name[len(CARRY_PREFIX):]))


def carry(parts: list[Path], run_files: list[Path], room: int) -> list[list[Path]]:
    """Into .carry1..N: the parts and the run call's files (one item), first fit, biggest first;
    the folder holding the run call's files last."""
    for old in carry_folders():
        shutil.rmtree(old)
    items = [[p] for p in parts] + [list(run_files)]
    bins: list[list[Path]] = []
    for item in sorted(items, key=lambda it: -sum(p.stat().st_size for p in it)):
        size = sum(p.stat().st_size for p in item)
        if size > room:
            raise SystemExit(f"build_parts: {item[0].name} ({size} B) is larger than the room "
                             f"of a call ({room} B)")
        for b in bins:
            if sum(x.stat().st_size for x in b) + size <= room:
                b.extend(item)
                break
        else:
            bins.append(list(item))
    bins.sort(key=lambda b: run_files[0] in b)
    for i, b in enumerate(bins, 1):
        d = ROOT / f"{CARRY_PREFIX}{i}"
        d.mkdir()
        for p in b:
            os.link(p, d / p.name) if p.stat().st_dev == d.stat().st_dev else shutil.copy2(p, d)
    return bins


def parts_calls(n: int) -> list[str]:
    """The header and the calls that move parts 1..n-1 onto the machine."""
    lines = ["The device calls, back to back (the machine goes back after 30 s idle):"]
    for i in range(1, n):
        folder = f"{CARRY_PREFIX}{i}"
        lines.append(f"  {i}. run(command='mkdir -p {MACHINE_PARTS} && mv {folder}/* "
                     f"{MACHINE_PARTS}/ && ls -la {MACHINE_PARTS}', carry=['{folder}'], "
                     "timeout_s=120)")
    return lines


def calls(n: int) -> str:
    lines = parts_calls(n)
    lines.append(f"  {n}. run(command='CARRY=.carry{n} bash bench/real_gpu/lab_run.sh', "
                 f"carry=['.carry{n}'], timeout_s=600)")
    lines.append(f"  {n + 1}. if it was cut (rc 124/137, or run.log says 'budget'): the same again "
                 "at once: it resumes from record.json on the warm machine")
    return "\n".join(lines)


def check(tree: int) -> int:
    folders = carry_folders()
    if not folders:
        say(f"no {CARRY_PREFIX} folders: run without --check first")
        return 1
    bad = 0
    for d in folders:
        size = sum(p.stat().st_size for p in d.iterdir())
        ok = size + tree <= CARRY_LIMIT
        bad += not ok
        names = " ".join(sorted(p.name for p in d.iterdir()))
        say(f"{d.name}: {size / MiB:6.1f} MiB + tree {tree / MiB:.1f} MiB "
            f"{'ok' if ok else 'OVER the 64 MiB of a call'}: {names}")
    ignored = subprocess.run(["git", "check-ignore", "-q", folders[0].name], cwd=ROOT).returncode
    if ignored != 0:
        say(f"{folders[0].name} is not git-ignored: it would travel with every call")
        bad += 1
    print(calls(len(folders)))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="check the built folders, print the calls")
    args = ap.parse_args(argv)
    tree = tree_bytes()
    if args.check:
        return check(tree)
    wheels = resolve()
    (BUILD / "wheels.json").write_text(json.dumps(
        {n: p.name for n, p in sorted(wheels.items())}, indent=1) + "\n")
    (BUILD / "image-needs.txt").write_text("".join(
        f"{n}\n" for n in sorted(IMAGE_NEEDS) if n not in wheels))
    say(f"{len(wheels)} wheels: {' '.join(sorted(p.name for p in wheels.values()))}")
    kernel = [wheels["sglang-kernel"]]
    site = [p for n, p in wheels.items() if n not in ("sglang-kernel", "zstandard")]
    if tree > TREE_ALLOWANCE:
        raise SystemExit(f"build_parts: the working tree ({tree / MiB:.1f} MiB) is over the "
                         f"{TREE_ALLOWANCE // MiB} MiB the parts leave it: raise TREE_ALLOWANCE")
    room = part_bytes = PART_BYTES
    parts = (pack("kernel", install("kernel", kernel), part_bytes)
             + pack("site312", install("site312", site), part_bytes))
    run_files = run_folder(wheels)
    bins = carry(parts, run_files, room)
    say(f"tree {tree / MiB:.1f} MiB (allowance {TREE_ALLOWANCE // MiB} MiB): "
        f"{len(bins)} carry folders")
    return check(tree)


if __name__ == "__main__":
    sys.exit(main())
