"""Facts about a host's NVIDIA GPUs, read with ``nvidia-smi``."""

from __future__ import annotations

import csv
import re
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

# The fields Gpus asks for; the parser reads columns by the header row, so more may be added.
QUERY_FIELDS = "index,name,compute_cap,memory.total,driver_version,pci.bus_id"
# What drivers too old to know ``compute_cap`` (before R510) are asked instead.
QUERY_FIELDS_OLD = "index,name,memory.total,driver_version,pci.bus_id"
OLD_DRIVER_TEXT = "is not a valid field to query"

# The last line of every nvidia-smi fact's output: nvidia-smi's own exit status.
RC_MARKER = "##specfleet-rc="

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LINK = re.compile(r"NV\d+|X|SYS|NODE|PHB|PXB|PIX|SOC")
_GPU_NAME = re.compile(r"GPU(\d+)")


def nvidia_smi_command(args: str, fallback_args: str | None = None) -> str:
    """A shell command that runs ``nvidia-smi ARGS`` and always exits 0.

    Prints nothing when there is no nvidia-smi. Otherwise prints nvidia-smi's stdout and stderr,
    then a last line ``##specfleet-rc=N`` with its exit status. With ``fallback_args``, a driver
    that rejects a query field (``... is not a valid field to query.``) is asked again with those
    arguments, and the rejection is kept as the first line.
    """
    run = f"out=$(nvidia-smi {args} 2>&1); rc=$?; "
    if fallback_args:
        run += (
            f'case "$out" in *"{OLD_DRIVER_TEXT}"*) '
            f'printf "%s\\n" "$out" | head -n 1; '
            f"out=$(nvidia-smi {fallback_args} 2>&1); rc=$?;; esac; "
        )
    return (
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        + run
        + f'printf "%s\\n" "$out"; echo "{RC_MARKER}$rc"; fi'
    )


def split_rc(lines: list[str]) -> tuple[list[str], int | None]:
    """Split a ``nvidia_smi_command`` output into nvidia-smi's lines and its exit status."""
    lines = [line.rstrip("\r") for line in lines]
    rc = None
    if lines and lines[-1].startswith(RC_MARKER):
        try:
            rc = int(lines[-1][len(RC_MARKER) :])
        except ValueError:
            rc = None
        lines = lines[:-1]
    return lines, rc


def _error_text(lines: list[str], rc: int | None) -> str:
    text = "\n".join(line.strip() for line in lines if line.strip())
    if not text:
        text = "nvidia-smi printed nothing"
    if rc not in (None, 0):
        text += f" (exit status {rc})"
    return text


def _int_or_none(value: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


def _text_or_none(value: str | None) -> str | None:
    value = (value or "").strip()
    if not value or value in ("[N/A]", "N/A", "[Not Supported]"):
        return None
    return value


def parse_query_gpu(lines: list[str]) -> dict[str, Any]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,nounits]`` output, found by its header.

    Returns ``{"gpus": [...], "error": None | str}``. Lines before the header (a rejected field,
    warnings) become the error text when no GPU could be read, or when the driver rejected
    ``compute_cap``.
    """
    lines, rc = split_rc(lines)
    header_at = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith("index,")), None
    )
    if header_at is None:
        return {"gpus": [], "error": _error_text(lines, rc)}

    rows = list(csv.reader(lines[header_at:], skipinitialspace=True))
    # "memory.total [MiB]" -> "memory.total"
    header = [re.sub(r"\s*\[.*\]$", "", name.strip()) for name in rows[0]]
    gpus = []
    for row in rows[1:]:
        if len(row) != len(header):
            continue
        field = dict(zip(header, (value.strip() for value in row), strict=True))
        cap = _text_or_none(field.get("compute_cap"))
        sm = None
        if cap and re.fullmatch(r"\d+\.\d+", cap):
            major, minor = cap.split(".")
            sm = int(major) * 10 + int(minor)
        else:
            cap = None
        gpus.append(
            {
                "index": _int_or_none(field.get("index")),
                "name": field.get("name", ""),
                "compute_capability": cap,
                "sm": sm,
                "memory_mib": _int_or_none(field.get("memory.total")),
                "driver": _text_or_none(field.get("driver_version")),
                "pci_bus_id": _text_or_none(field.get("pci.bus_id")),
            }
        )

    error = None
    before = [line for line in lines[:header_at] if line.strip()]
    if any(OLD_DRIVER_TEXT in line for line in before):
        error = _error_text(before, None)
    elif rc not in (None, 0) or not gpus:
        error = _error_text(lines, rc)
    return {"gpus": gpus, "error": error}


def parse_topology(lines: list[str]) -> dict[str, Any]:
    """Parse ``nvidia-smi topo -m``: the GPU-to-GPU link matrix.

    Real output varies by driver: ANSI codes in the header, tabs or runs of spaces, NIC
    (``mlx5_*``/``NICn``) rows and columns, optional "NUMA Affinity"/"GPU NUMA ID" columns, and
    columns printed without a separator (``NODENODE``). Only the GPU columns, which always come
    first, are read, token by token.
    """
    lines, rc = split_rc(lines)
    clean = [_ANSI.sub("", line).rstrip() for line in lines]
    header_at = next((i for i, line in enumerate(clean) if line.strip().startswith("GPU0")), None)
    if header_at is None:
        return {"gpus": [], "links": {}, "nvlink_all_pairs": False, "error": _error_text(lines, rc)}

    gpus = [f"GPU{n}" for n in _GPU_NAME.findall(clean[header_at])]
    links: dict[str, dict[str, str]] = {}
    for line in clean[header_at + 1 :]:
        label, *rest = re.split(r"\s+", line.strip(), maxsplit=1)
        if label not in gpus:
            continue
        tokens = _LINK.findall(rest[0] if rest else "")[: len(gpus)]
        links[label] = {
            other: token
            for other, token in zip(gpus[: len(tokens)], tokens, strict=True)
            if other != label and token != "X"
        }

    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    nvlink_all_pairs = len(gpus) > 1 and all(
        links.get(a, {}).get(b, "").startswith("NV") for a, b in pairs
    )
    error = None if rc in (None, 0) else _error_text(lines, rc)
    return {"gpus": gpus, "links": links, "nvlink_all_pairs": nvlink_all_pairs, "error": error}


def parse_compute_apps(lines: list[str]) -> dict[str, Any]:
    """Parse ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``."""
    lines, rc = split_rc(lines)
    processes = []
    other = []
    for line in lines:
        match = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+|\[N/A\]|N/A)\s*(?:MiB)?\s*", line)
        if match:
            processes.append(
                {"pid": int(match.group(1)), "used_memory_mib": _int_or_none(match.group(2))}
            )
        elif line.strip():
            other.append(line)
    error = None
    if rc not in (None, 0) or (other and not processes):
        error = _error_text(other or lines, rc)
    return {"processes": processes, "error": error}


class Gpus(FactBase[dict]):
    """
    Returns the host's NVIDIA GPUs. ``gpus`` is empty, with no error, where there is no
    nvidia-smi. Where nvidia-smi fails (no driver, driver/library mismatch, no devices), ``error``
    holds its text. A driver too old to know ``compute_cap`` gives GPUs with
    ``compute_capability``/``sm`` None and its rejection as ``error``.

    .. code:: python

        {
            "gpus": [
                {
                    "index": 0,
                    "name": "NVIDIA H200",
                    "compute_capability": "9.0",
                    "sm": 90,
                    "memory_mib": 143771,
                    "driver": "580.159.04",
                    "pci_bus_id": "00000000:00:06.0",
                },
            ],
            "error": None,
        }
    """

    @staticmethod
    def default() -> dict:
        return {"gpus": [], "error": None}

    @override
    def command(self) -> str:
        return nvidia_smi_command(
            f"--query-gpu={QUERY_FIELDS} --format=csv,nounits",
            fallback_args=f"--query-gpu={QUERY_FIELDS_OLD} --format=csv,nounits",
        )

    @override
    def process(self, output: list[str]) -> dict:
        return parse_query_gpu(output)


class GpuTopology(FactBase[dict]):
    """
    Returns the GPU-to-GPU links of ``nvidia-smi topo -m``. ``nvlink_all_pairs`` is True when
    there are at least two GPUs and every pair is joined by NVLink (``NV#``).

    .. code:: python

        {
            "gpus": ["GPU0", "GPU1"],
            "links": {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}},
            "nvlink_all_pairs": True,
            "error": None,
        }
    """

    @staticmethod
    def default() -> dict:
        return {"gpus": [], "links": {}, "nvlink_all_pairs": False, "error": None}

    @override
    def command(self) -> str:
        return nvidia_smi_command("topo -m")

    @override
    def process(self, output: list[str]) -> dict:
        return parse_topology(output)


class GpuProcesses(FactBase[dict]):
    """
    Returns the processes holding GPU memory (busy GPUs), from
    ``nvidia-smi --query-compute-apps``.

    .. code:: python

        {
            "processes": [{"pid": 4242, "used_memory_mib": 96860}],
            "error": None,
        }
    """

    @staticmethod
    def default() -> dict:
        return {"processes": [], "error": None}

    @override
    def command(self) -> str:
        return nvidia_smi_command(
            "--query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
        )

    @override
    def process(self, output: list[str]) -> dict:
        return parse_compute_apps(output)
