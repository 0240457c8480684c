"""Facts about the distributions installed in a Python environment (their metadata files)."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from facts.hostpy import ISOLATED, PythonJob, parse_printed, script_source
from facts.sglang import DEFAULT_PYTHON
from specfleet.core.layout import venv_python

# The distributions a deploy asks about by default (canonical names, PEP 503).
PACKAGES = [
    "sglang",
    "sglang-kernel",
    "sgl-kernel",
    "torch",
    "transformers",
    "compressed-tensors",
    "flashinfer-python",
    "huggingface-hub",
]

# Runs in the target interpreter with -I -S (no .pth file's code runs; the site folders are found
# by ``specfleet.hostside.dists.site_paths``). argv[1]: the names, comma-separated; argv[2] (tests
# only): a directory to search first. Prints (a Python literal) every installed distribution's
# name and version, and the raw direct_url.json of those that have one; the choosing happens in
# ``parse_packages``.
COLLECT = script_source("python_packages.py")


def canonical(name: str) -> str:
    """PEP 503 normalisation: ``Compressed_Tensors`` -> ``compressed-tensors``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _direct_url(raw: str | None) -> dict | None:
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    vcs = data.get("vcs_info") or {}
    return {"url": data.get("url"), "commit": vcs.get("commit_id")}


def parse_packages(collected: dict) -> dict:
    """Build the ``Packages`` value from what the host-side collector sent back."""
    names = [canonical(n) for n in collected.get("names") or PACKAGES]
    dists = {canonical(k): v for k, v in (collected.get("dists") or {}).items()}
    value: dict = {name: (dists.get(name) or {}).get("version") for name in names}
    value["python_version"] = collected.get("python")
    value["direct_urls"] = {
        name: url
        for name, info in sorted(dists.items())
        if (url := _direct_url(info.get("direct_url"))) is not None
    }
    return value


def empty_value(names: list[str] | None = None) -> dict:
    value: dict = {canonical(n): None for n in names or PACKAGES}
    value.update(python_version=None, direct_urls={})
    return value


class Packages(FactBase[dict]):
    """
    Returns the versions of selected distributions installed for ``python`` (None when not
    installed; everything None, and ``python_version`` None, when the interpreter is absent), and
    the direct URL (``pip install git+...``, local paths) of every distribution installed from one.

    + python: the interpreter whose environment is inspected
    + names: distribution names to report (default: sglang, sglang-kernel, sgl-kernel, torch,
      transformers, compressed-tensors, flashinfer-python, huggingface-hub)

    .. code:: python

        {
            "sglang": "0.5.11",
            "torch": "2.11.0",
            "transformers": "5.6.0",
            "compressed-tensors": None,
            ...,
            "python_version": "3.11.2",
            "direct_urls": {
                "sglang": {"url": "https://github.com/sgl-project/sglang", "commit": "e67a0d4..."},
            },
        }
    """

    @staticmethod
    def default() -> dict:
        return empty_value()

    def python_job(
        self, python: str = DEFAULT_PYTHON, names: list[str] | None = None
    ) -> PythonJob:
        wanted = [canonical(n) for n in names or PACKAGES]
        return PythonJob(python, ISOLATED, COLLECT, (",".join(wanted),))

    @override
    def command(
        self, python: str = DEFAULT_PYTHON, names: list[str] | None = None
    ) -> StringCommand:
        wanted = [canonical(n) for n in names or PACKAGES]
        return StringCommand(
            "if",
            # command -v: the interpreter may be a path (a venv's bin/python) or a bare name.
            "command",
            "-v",
            QuoteString(python),
            ">/dev/null",
            ";",
            "then",
            *self.python_job(python, names).words(),
            ";",
            "else",
            "echo",
            QuoteString(json.dumps({"python": None, "names": wanted, "dists": {}})),
            ";",
            "fi",
        )

    @override
    def process(self, output: list[str]) -> dict:
        return parse_packages(parse_printed("\n".join(output)))


PIP_PLAN = script_source("pip_plan.py")


def parse_pip_plan(output: list[str]) -> dict | None:
    """The PipInstallPlan value from its script's one JSON line (None: no venv Python)."""
    for line in reversed(output):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                break
            return value if isinstance(value, dict) else None
    text = "\n".join(line for line in output if line.strip())
    return {"rc": None, "error": text[-800:] or "no answer", "install": [], "installed": {},
            "pip_version": None, "created_by_specfleet": False} if text else None


class PipInstallPlan(FactBase[Any]):
    """
    What ``pip install [pip_args] requirement`` would change in the venv ``venv``, from pip's
    own dry run (``pip install --dry-run --report``), changing nothing; ``None`` when the venv has
    no Python. ``install`` is pip's report's list (format 1, cut to name, version, requested);
    ``installed`` every distribution there now; ``created_by_specfleet`` whether
    ``sglang.installed`` created the venv (its marker file). Only asked before an install into an
    existing venv: a converged run never asks it.

    .. code:: python

        {"rc": 0, "error": None, "pip_version": "23.0.1", "created_by_specfleet": False,
         "install": [{"metadata": {"name": "torch", "version": "2.9.1"}, "requested": False},
                     {"metadata": {"name": "sglang", "version": "0.5.14"}, "requested": True}],
         "installed": {"torch": "2.8.0", "sglang": "0.5.11", ...}}
    """

    @override
    def command(self, venv: str, requirement: str, pip_args: list[str] | None = None) -> str:
        py = shlex.quote(venv_python(venv))
        words = [venv, *(pip_args or []), requirement]
        return (f"if test -x {py}; then {py} -I -c {shlex.quote(PIP_PLAN)} "
                f"{' '.join(shlex.quote(w) for w in words)}; fi")

    @override
    def process(self, output: list[str]) -> dict | None:
        return parse_pip_plan(output)
