"""Helpers of the Python scripts that facts run on a host, and of reading what they print.

The scripts are run on every host of every deploy, so each import counts: they embed
``installed_dists`` and ``dist_version`` (``host_source``) instead of importing
``importlib.metadata`` (about 40 ms of CPU, four fifths of such a fact), and print ``repr`` of
their value instead of importing ``json``; ``parse_printed`` reads either. A probe runs the
scripts of one interpreter in one process (``PythonJob``, ``RUNNER``).
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import json
import re
from dataclasses import dataclass

from pyinfra.api import QuoteString

from specfleet.core.resources import hostside_path
from specfleet.hostside.dists import dist_version, editable_packages, installed_dists, site_paths
from specfleet.hostside.weights_agent import pids_using


def host_source(*functions) -> str:
    """The source of ``functions``, for the top of a script run by a host's Python, whatever
    its version: their annotations are not evaluated there."""
    return "from __future__ import annotations\n" + "".join(map(inspect.getsource, functions))


_HELPERS = {"installed_dists": installed_dists, "dist_version": dist_version,
            "site_paths": site_paths, "editable_packages": editable_packages,
            "pids_using": pids_using}


def script_source(name: str) -> str:
    """A fact script of ``specfleet/hostside/facts/`` as one ``-c`` argument: the helpers its
    ``# needs:`` line names, then the script."""
    text = hostside_path(f"facts/{name}").read_text()
    if text.startswith('"""'):  # the docstring is for readers here, not bytes on every probe
        text = text[text.index('"""', 3) + 3 :].lstrip("\n")
    m = re.search(r"^# needs: (.+)$", text, re.M)
    needs = [n.strip() for n in m.group(1).split(",")] if m else []
    return host_source(*(_HELPERS[n] for n in needs)) + text


def parse_printed(text: str):
    """The value a host-side script printed: a Python literal (``repr``: such scripts need not
    import ``json``, 7 ms of a 15 ms script) or JSON (older scripts, captured fixtures)."""
    return copy.deepcopy(_parse_printed_once(text))


@functools.lru_cache(maxsize=256)
def _parse_printed_once(text: str):
    # Hosts of one build print the same text: parsed once per distinct text (``ast`` is the
    # costliest step of a converged run's facts), a copy handed to each caller.
    try:
        return json.loads(text)
    except ValueError:
        return ast.literal_eval(text)


# How the fact scripts run a venv's interpreter: isolated (no cwd, PYTHONPATH or user site) and
# without ``site`` (-S), whose ``.pth`` files are code: a script finds the site folders itself
# (``# needs: site_paths``), reading the .pth files' path lines, never running their imports.
ISOLATED = ("-I", "-S")


@dataclass(frozen=True)
class PythonJob:
    """A fact whose command is one Python script, ``interpreter *flags -c source *argv``, when
    the interpreter is there. A probe runs every such script of one interpreter (and flags) in
    one process (``RUNNER``): one interpreter start, and one ``json`` import, instead of one per
    fact. The fact's ``command`` stays what it runs alone (with what it says when the
    interpreter is missing)."""

    interpreter: str
    flags: tuple[str, ...]
    source: str
    argv: tuple[str, ...] = ()

    def words(self) -> list:
        return [QuoteString(self.interpreter), *self.flags, "-c", QuoteString(self.source),
                *(QuoteString(a) for a in self.argv)]



RUNNER = script_source("runner.py")
