"""A Python with CPU-only torch, for the few tests that need real ``torch.distributed`` (a gloo
group of CPU processes): a venv under ``/var/cache/specfleet/torch-cpu``, made once per machine
(like the wheelhouse) and never part of the project's own venv.

torch's CPU wheel comes from PyTorch's CPU index (PyPI's torch carries the CUDA libraries). Fails with what is missing and how to get it; never skips.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from tests.harness.rootfs import CACHE_DIR

TORCH_VENV = CACHE_DIR / "torch-cpu"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# A CPU build, pinned: PyPI has no "+cpu" version, so pip takes it from the CPU index (or from a
# find-links that holds it) and PyPI gives only its dependencies.
REQUIREMENTS = ["torch==2.13.0+cpu"]
_MARKER = ".specfleet-torch-cpu"


def torch_python() -> Path:
    """The venv's interpreter (made on first use: python -m venv, then pip install torch)."""
    python = TORCH_VENV / "bin" / "python"
    if (TORCH_VENV / _MARKER).exists():
        return python
    TORCH_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "torch-cpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (TORCH_VENV / _MARKER).exists():
            return python
        print(f"tests: making {TORCH_VENV} (CPU torch, once)...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(TORCH_VENV)], check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--retries", "1", "--timeout", "30", "--extra-index-url", CPU_INDEX,
             *REQUIREMENTS],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(
                f"cannot install CPU torch into {TORCH_VENV}:\n{done.stderr[-3000:]}\n"
                f"fix: let this machine reach {CPU_INDEX} (or give pip a find-links with a "
                "CPU torch wheel)"
            )
        (TORCH_VENV / _MARKER).write_text("ok\n")
    return python
