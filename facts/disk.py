"""Facts about a host's disks."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

_ASKED = "##specfleet-path="
_MEASURED = "##specfleet-measured="


def parse_free_space(output: list[str]) -> dict:
    """Parse the FreeSpace command's output: two marker lines (the asked and the measured path),
    then ``df -B1 --output=size,avail,target`` (a header and one row; the mount may hold spaces)."""
    value = {
        "path": None,
        "measured_path": None,
        "mount": None,
        "total_bytes": None,
        "free_bytes": None,
        "error": None,
    }
    rows = []
    for line in output:
        if line.startswith(_ASKED):
            value["path"] = line[len(_ASKED) :]
        elif line.startswith(_MEASURED):
            value["measured_path"] = line[len(_MEASURED) :]
        elif line.strip() and not line.lstrip().startswith("1B-blocks"):
            rows.append(line)
    parts = rows[-1].split(None, 2) if rows else []
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
        value.update(total_bytes=int(parts[0]), free_bytes=int(parts[1]), mount=parts[2])
    else:
        value["error"] = "\n".join(rows) or "df printed nothing"
    return value


class FreeSpace(FactBase[dict]):
    """
    Returns the size and free space of the filesystem holding ``path``, measured on the nearest
    existing ancestor when ``path`` does not exist yet (``measured_path``). A failing ``df``
    leaves the numbers None and its text in ``error``.

    + path: an absolute path, existing or to be created

    .. code:: python

        {
            "path": "/srv/models/moonshotai--Kimi-K2.6",
            "measured_path": "/srv/models",
            "mount": "/srv/models",
            "total_bytes": 687194767360,
            "free_bytes": 687194767360,
            "error": None,
        }
    """

    @override
    def command(self, path: str = "/") -> StringCommand:
        return StringCommand(
            "p=",
            QuoteString(path),
            f'; printf "{_ASKED}%s\\n" "$p";',
            ' while [ ! -e "$p" ] && [ "$p" != / ] && [ "$p" != . ]; do p=$(dirname "$p"); done;',
            f' printf "{_MEASURED}%s\\n" "$p"; df -B1 --output=size,avail,target "$p" 2>&1 || true',
            _separator="",
        )

    @override
    def process(self, output: list[str]) -> dict:
        return parse_free_space(output)
