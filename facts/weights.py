"""Facts about model weights on a host: the revisions there, a running download, the agent."""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from facts.hostpy import PythonJob, parse_printed, script_source
from specfleet.core.layout import venv_python

# Run on the host by the system python3: read each revision's manifest and compare every file's
# size and mtime with it (the fast re-check: no hashing). Prints one JSON object.
_STATE_SCRIPT = script_source("weights_state.py")

_TOOLS_SCRIPT = script_source("weights_tools.py")


def parse_json_output(output: list[str]) -> Any:
    """The value (JSON or a Python literal) a fact's command printed: its last non-empty line."""
    lines = [line for line in output if line.strip()]
    if not lines:
        return None
    return parse_printed(lines[-1])


def agent_command(python: str, agent: str, *args: str) -> StringCommand:
    """The weights agent's ``args`` (a subcommand and its argument), run by the tools venv's
    python; nothing, so the fact is ``None``, while the tools are not installed."""
    return StringCommand(
        "!", "test", "-x", QuoteString(python), "||", "!", "test", "-f", QuoteString(agent),
        "||", QuoteString(python), QuoteString(agent), *[QuoteString(a) for a in args],
    )


class PrintedJsonFact(FactBase[dict[str, Any]]):
    """A fact whose command prints one JSON value last (``parse_json_output``)."""

    @override
    def process(self, output: list[str]) -> dict[str, Any] | None:
        return parse_json_output(output)


class WeightsState(FactBase[dict[str, Any]]):
    """
    The revisions of one model under its root, each checked fast against its manifest (size and
    mtime of every file; nothing is hashed), and the revision the ``current`` link points to.
    With ``in_use``, the processes using each revision (``in_use`` pids; see
    ``specfleet.hostside.weights_agent.pids_using``).

    .. code:: python

        {
            "path": "/srv/models/moonshotai--Kimi-K2.6",
            "current": "3f1c...40 hex",
            "revisions": {
                "3f1c...": {"complete": True, "files": 66, "bytes": 595171160064,
                            "changed": [], "missing": [], "in_use": [],
                            "verified_at": 1796050619.1,
                            "allow_patterns": None, "ignore_patterns": None},
            },
        }
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "python3"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"path": None, "current": None, "revisions": {}}

    def python_job(self, path: str, in_use: bool = False) -> PythonJob:
        return PythonJob("python3", ("-I", "-S"), _STATE_SCRIPT,
                         (path, "in-use") if in_use else (path,))

    @override
    def command(self, path: str, in_use: bool = False) -> StringCommand:
        return StringCommand(*self.python_job(path, in_use).words())

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_json_output(output) or self.default()


def parse_job(output: list[str]) -> dict[str, Any]:
    """Lines ``unit NAME`` (the active units), then ``progress`` and the progress file (JSON)."""
    units: list[str] = []
    progress = None
    for at, line in enumerate(output):
        kind, _, value = line.strip().partition(" ")
        if kind == "unit" and value:
            units.append(value)
        elif kind == "progress":
            try:
                progress = json.loads("\n".join(output[at + 1:]))
            except ValueError:
                progress = None  # caught mid-write; the next poll reads it
            break
    return {"active": bool(units), "units": units, "progress": progress}


def job_command(pattern: str, progress_path: str) -> StringCommand:
    """The active units matching ``pattern`` (a unit name or a glob), then the progress file."""
    return StringCommand(
        "(",
        "systemctl", "list-units", "--plain", "--no-legend", "--full",
        "--state=active,activating,reloading", QuoteString(pattern), "|",
        "awk", QuoteString('{print "unit " $1}'), ";",
        "!", "test", "-f", QuoteString(progress_path), "||",
        "{", "echo", "progress", ";", "cat", QuoteString(progress_path), ";", "}",
        ")",
    )


class WeightsJob(FactBase[dict[str, Any]]):
    """
    The active download units of one model (``pattern``: a unit name or a glob) and the
    progress file their agent writes.

    .. code:: python

        {"active": True, "units": ["specfleet-weights-moonshotai--Kimi-K2.6-run-1a2b3c4d.service"],
         "progress": {"job_id": "...", "state": "downloading", "revision": "...",
                      "bytes_done": 1234, "bytes_total": 5678, "files_done": 3,
                      "files_total": 66, "rate_bps": 104857600, "error": None, ...}}
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "systemctl"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"active": False, "units": [], "progress": None}

    @override
    def command(self, pattern: str, progress_path: str) -> StringCommand:
        return job_command(pattern, progress_path)

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_job(output)


class WeightsTools(PrintedJsonFact):
    """
    The weights tools venv: its huggingface_hub version (from the package metadata, without
    importing it) and the agent script's sha256.

    .. code:: python

        {"path": "/opt/specfleet/tools", "huggingface_hub": "2.4.0", "agent_sha256": "ab12..."}

    ``None`` when the venv has no python.
    """

    def python_job(self, path: str) -> PythonJob:
        return PythonJob(venv_python(path), (), _TOOLS_SCRIPT, (path,))

    @override
    def command(self, path: str) -> StringCommand:
        job = self.python_job(path)
        return StringCommand("!", "test", "-x", QuoteString(job.interpreter), "||", *job.words())


class WeightsPlan(PrintedJsonFact):
    """
    What a download would do, asked of the Hub (or ``HF_ENDPOINT``) by the agent on the host:
    the resolved revision, the files with sizes and hashes, the bytes still missing and the free
    space. ``None`` while the tools are not installed. A Hub error is ``{"error": {...}}``.

    .. code:: python

        {"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": "9a8b...", "requested": "main",
         "files": [{"path": "model.safetensors", "size": 6979321856, "blob_id": "...",
                    "sha256": "..."}],
         "total_bytes": 6979330000, "missing": ["model.safetensors"],
         "missing_bytes": 6979321856, "free_bytes": 636727205888,
         "total_disk_bytes": 1000000000000}
    """

    @override
    def command(self, python: str, agent: str, job_json: str) -> StringCommand:
        return agent_command(python, agent, "plan", job_json)


class WeightsDeepCheck(PrintedJsonFact):
    """
    Every file of a complete revision re-hashed on the host against its manifest (sha256 for
    LFS files, the git blob id for others); no Hub needed. Slow: it reads every byte. ``None``
    while the tools are not installed.

    .. code:: python

        {"checked": 66, "bad": {"model-00002-of-00064.safetensors": "sha256 ab.. != cd.."},
         "error": None}
    """

    @override
    def command(self, python: str, agent: str, path: str) -> StringCommand:
        return agent_command(python, agent, "check", path)
