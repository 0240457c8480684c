"""Small, valid wheels whose metadata pins dependencies as SGLang's do: for pip's own resolver and
dry-run reports, without torch's gigabytes.

The fleet's wheelhouse has the real SGLang wheels but not their dependencies, and PyPI is not
reached from the hosts; these stand in for an upgrade that moves torch and sgl-kernel with it.
Each wheel holds one empty module and its dist-info (METADATA with the pins, WHEEL, RECORD).
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

# (name, version, requires): an SGLang 0.5.11 venv, and the 0.5.14 that moves torch,
# sgl-kernel and adds a dependency; 0.5.12 needs nothing new.
UPGRADE = [
    ("torch", "2.8.0", []),
    ("torch", "2.9.1", []),
    ("sgl-kernel", "0.3.9", ["torch"]),
    ("sgl-kernel", "0.3.16", ["torch"]),
    ("compressed-tensors", "0.9.4", []),
    ("newdep", "1.0", []),
    ("sglang", "0.5.11", ["torch==2.8.0", "sgl-kernel==0.3.9", "compressed-tensors"]),
    ("sglang", "0.5.12", ["torch==2.8.0", "sgl-kernel==0.3.9", "compressed-tensors"]),
    ("sglang", "0.5.14", ["torch==2.9.1", "sgl-kernel==0.3.16", "compressed-tensors", "newdep"]),
]
# What the "before" venv holds.
BEFORE = ["torch==2.8.0", "sgl-kernel==0.3.9", "compressed-tensors==0.9.4", "sglang==0.5.11"]


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def build_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{info}/METADATA": "\n".join([
            "Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
            "Summary: a stand-in wheel of specfleet's tests",
            *(f"Requires-Dist: {r}" for r in requires), "",
        ]).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specfleet-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(f"{p},{_hash(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0)), d)
    return path


def build_upgrade_wheels(folder: Path) -> list[Path]:
    return [build_wheel(folder, n, v, r) for n, v, r in UPGRADE]
