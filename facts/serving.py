"""Facts about the specfleet SGLang server's systemd unit and its files."""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "UnitFileState",
    "NeedDaemonReload",
    "NRestarts",
    "MainPID",
    "InvocationID",
)

FILE_MARK = "##file "
MARKER_MARK = "##restart-pending"
# A line serving.service appends to the marker once it restarted the server for it: the restart's
# invocation, its host time and the fingerprint of the unit's files it started from.
STARTED_MARK = "##started "


class ServiceState(FactBase[dict[str, Any]]):
    """
    The state of one systemd unit, the files it is built from and its restart-pending marker, read
    with one command. A file that does not exist is left out of ``files``; ``restart_pending`` is
    the marker's text (why a restart is pending) or None when there is no marker;
    ``restart_started`` is the restart done for it (``serving.service`` records it in the marker
    right after ``systemctl restart``), or None while the restart is still to be done.

    .. code:: python

        {
            "load_state": "loaded",
            "active_state": "active",
            "sub_state": "running",
            "result": "success",
            "unit_file_state": "enabled",
            "need_daemon_reload": False,
            "n_restarts": 0,
            "main_pid": 4242,
            "invocation_id": "6a1f0c2d9b8e4f7a8c3d2e1f0a9b8c7d",
            "files": {
                "/etc/systemd/system/specfleet-sglang.service": {
                    "mode": 644, "user": "root", "group": "root",
                    "sha1": "0b5c5a5c4f8e0d6c7b2f1c8a9e3d2b1a0f9e8d7c",
                },
            },
            "restart_pending": "the unit changed",
            "restart_started": {"invocation": "6a1f0c2d9b8e4f7a8c3d2e1f0a9b8c7d",
                                "at": 1764590400, "files": "0b5c5a5c4f8e0d6c"},
        }
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "systemctl"

    @override
    def command(self, service: str, paths: list[str] | None = None, marker: str | None = None):
        props = " ".join(f"-p {p}" for p in UNIT_PROPERTIES)
        parts = [f"systemctl show {shlex.quote(service)} {props}"]
        for path in paths or []:
            q = shlex.quote(path)
            parts.append(
                f"if test -e {q}; then echo {shlex.quote(FILE_MARK + path)}; "
                f"stat -c '%a %U %G' {q}; sha1sum < {q}; fi"
            )
        if marker:
            q = shlex.quote(marker)
            parts.append(f"if test -e {q}; then echo '{MARKER_MARK}'; head -c 2048 {q}; echo; fi")
        return "; ".join(parts)

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_service_state(output)


def parse_service_state(output: list[str]) -> dict[str, Any]:
    props: dict[str, str] = {}
    files: dict[str, dict[str, Any]] = {}
    marker: list[str] | None = None
    started: dict[str, Any] | None = None
    current: str | None = None
    file_lines: list[str] = []

    def close_file() -> None:
        if current is None:
            return
        info: dict[str, Any] = {"mode": None, "user": None, "group": None, "sha1": None}
        if file_lines:
            bits = file_lines[0].split()
            if len(bits) == 3:
                info["mode"] = int(bits[0]) if bits[0].isdigit() else None
                info["user"], info["group"] = bits[1], bits[2]
        if len(file_lines) > 1:
            info["sha1"] = file_lines[1].split()[0]
        files[current] = info

    for line in output:
        if line.startswith(FILE_MARK):
            close_file()
            current, file_lines = line[len(FILE_MARK) :], []
        elif line == MARKER_MARK:
            close_file()
            current = None
            marker = []
        elif marker is not None and line.startswith(STARTED_MARK):
            started = parse_started(line)
        elif marker is not None:
            marker.append(line)
        elif current is not None:
            file_lines.append(line)
        elif "=" in line:
            key, _, value = line.partition("=")
            props[key] = value
    close_file()

    def as_int(value: str | None) -> int:
        return int(value) if value and value.isdigit() else 0

    return {
        "load_state": props.get("LoadState", "not-found"),
        "active_state": props.get("ActiveState", "inactive"),
        "sub_state": props.get("SubState", "dead"),
        "result": props.get("Result", ""),
        "unit_file_state": props.get("UnitFileState", ""),
        "need_daemon_reload": props.get("NeedDaemonReload") == "yes",
        "n_restarts": as_int(props.get("NRestarts")),
        "main_pid": as_int(props.get("MainPID")),
        "invocation_id": props.get("InvocationID", ""),
        "files": files,
        "restart_pending": (" ".join(" ".join(marker).split()) or "a restart is pending")
        if marker is not None
        else None,
        "restart_started": started if marker is not None else None,
    }


def parse_started(line: str) -> dict[str, Any] | None:
    """``##started invocation=ID at=EPOCH files=FINGERPRINT`` -> a dict, or None when a field is
    missing or empty (a restart whose record was cut short counts as not recorded)."""
    fields = dict(w.split("=", 1) for w in line[len(STARTED_MARK) :].split() if "=" in w)
    at = fields.get("at", "")
    if not fields.get("invocation") or not fields.get("files") or not at.isdigit():
        return None
    return {"invocation": fields["invocation"], "at": int(at), "files": fields["files"]}


class FirstJson(FactBase[Any]):
    """
    The parsed content of the first of ``paths`` that exists (a model's ``config.json``), or None
    when none exists. A file that is not JSON fails the fact, naming the file.

    .. code:: python

        {"architectures": ["DFlashDraftModel"], "block_size": 8, ...}
    """

    @override
    def command(self, paths: list[str]) -> str:
        tests = "; ".join(
            f"if test -f {shlex.quote(p)}; then echo {shlex.quote(PATH_MARK + p)}; "
            f"cat {shlex.quote(p)}; exit 0; fi"
            for p in paths
        )
        return f"sh -c {shlex.quote(tests + '; exit 0')}"

    @override
    def process(self, output: list[str]) -> Any:
        return parse_first_json(output)


PATH_MARK = "##path "


def parse_first_json(output: list[str]) -> Any:
    import json

    if not output or not output[0].startswith(PATH_MARK):
        return None
    path = output[0][len(PATH_MARK) :]
    text = "\n".join(output[1:])
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): {text[:80]!r}") from None


class FileText(FactBase[Any]):
    """
    The text of a small file with surrounding whitespace stripped (the applied patch's sha256
    marker), or None when it does not exist.

    .. code:: python

        "9f2c4e0d..."
    """

    @override
    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"if test -f {q}; then echo {shlex.quote(PATH_MARK + path)}; head -c 4096 {q}; fi"

    @override
    def process(self, output: list[str]) -> Any:
        if not output or not output[0].startswith(PATH_MARK):
            return None
        return "\n".join(output[1:]).strip()


# Where systemd finds a service's unit file: the admin's, the runtime's and the vendor's folders.
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/lib/systemd/system",
             "/usr/lib/systemd/system")


class UnitFiles(FactBase[dict[str, str]]):
    """
    The first line of every unit file of the given names in systemd's folders (``UNIT_DIRS``),
    cut to 200 characters: preflight tells a unit specfleet wrote (its header) from one of the
    host's own that the deploy would shadow or overwrite.

    + names: unit names (``specfleet-sglang.service``)

    .. code:: python

        {"/etc/systemd/system/specfleet-sglang.service":
            "# Managed by specfleet (specfleet-sglang). Edits here are overwritten ..."}
    """

    @override
    def command(self, names: list[str]) -> str:
        parts = []
        for d in UNIT_DIRS:
            for n in names:
                q = shlex.quote(f"{d}/{n}")
                parts.append(f"if test -e {q} || test -L {q}; then echo {shlex.quote(PATH_MARK)}"
                             f"{q}; head -n 1 {q} 2>/dev/null | head -c 200; echo; fi")
        return "; ".join(parts) + "; true"

    @override
    def process(self, output: list[str]) -> dict[str, str]:
        return parse_unit_files(output)


def parse_unit_files(output: list[str]) -> dict[str, str]:
    """``UnitFiles``' output -> {path: first line} (pure)."""
    out: dict[str, str] = {}
    path = None
    for line in output:
        if line.startswith(PATH_MARK):
            path = line[len(PATH_MARK):]
            out[path] = ""
        elif path is not None and not out[path]:
            out[path] = line
    return out
