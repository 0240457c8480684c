"""A port of PR#20547 onto one SGLang release, as data: which of the PR's hunks to take (by
index, from the PR diff pinned by sha256), this project's adaptation diff applied after them, and
the sha256 of every file it touches in that release's wheel (its RECORD). Pure: the caller reads
the files (``operations.sglang_commands.load_port``) and the host's file hashes.

A tree whose files do not hash as the wheel's gets "no port for this tree" and keeps v1: a port is
never applied fuzzily.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from specfleet.core.sglang.patch import FilteredPatch, _split_sections, filter_patch
from specfleet.core.sglang.pr20547 import PortVerdict
from specfleet.core.tables.sglang_versions import V2_BUILTIN_SINCE

_HUNK = re.compile(r"^@@ ")
# Releases with a port (specfleet/patchdata/pr20547/sglang-<version>/).
PORTED_RELEASES = ("0.5.11",)


def hex_sha256(value: str) -> str:
    """A sha256 as lower-case hex, given as hex or as RECORD's urlsafe base64 (no padding)."""
    if re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return value.lower()
    raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    return raw.hex()


def select_hunks(text: str, indexes) -> str:
    """The unified diff ``text`` with only the hunks whose index (from 0, in the diff's order)
    is in ``indexes``, each under its file's headers."""
    wanted = set(indexes)
    out: list[str] = []
    n = 0
    for sec in _split_sections(text):
        header: list[str] = []
        hunks: list[list[str]] = []
        for line in sec.lines:
            if _HUNK.match(line) and sec.has_headers:
                hunks.append([line])
            elif hunks:
                hunks[-1].append(line)
            else:
                header.append(line)
        taken = [h for i, h in enumerate(hunks, start=n) if i in wanted]
        n += len(hunks)
        if taken:
            out += header + [line for h in taken for line in h]
    return "".join(out)


@dataclass(frozen=True)
class Port:
    version: str
    pr_diff_sha256: str
    # {path under site-packages: sha256 hex} in the release's wheel.
    targets: Mapping[str, str]
    pr_hunks: tuple[int, ...]
    adaptation: str
    adaptation_hunks: int = 0

    @classmethod
    def from_data(cls, data: Mapping, adaptation: str) -> Port:
        return cls(
            version=str(data["sglang_version"]),
            pr_diff_sha256=str(data["pr_diff_sha256"]).lower(),
            targets={p: hex_sha256(h) for p, h in dict(data["targets"]).items()},
            pr_hunks=tuple(int(i) for i in data["pr_hunks"]),
            adaptation=adaptation,
            adaptation_hunks=adaptation.count("\n@@ ") + adaptation.startswith("@@ "),
        )

    def patch(self, pr_text: str) -> FilteredPatch:
        """The one diff this port applies: its PR hunks, then the adaptation."""
        taken = select_hunks(pr_text, self.pr_hunks)
        return filter_patch(filter_patch(taken).text + self.adaptation)

    def describe(self) -> str:
        return (
            f"the PR#20547 port for SGLang {self.version} ({len(self.pr_hunks)} PR hunks + "
            f"{self.adaptation_hunks} adaptation hunks)"
        )


def no_port_verdict(version: str) -> PortVerdict:
    return PortVerdict(
        False,
        text=f"this project has no port of PR#20547 for SGLang {version} (ports: "
        f"{', '.join(PORTED_RELEASES)})",
        fix=f"set sglang.version >= {V2_BUILTIN_SINCE} (v2 built in), or "
        f"{' or '.join(PORTED_RELEASES)} for the port",
    )


def port_verdict(
    port: Port, version: str, pr_sha256: str, file_hashes: Mapping[str, str | None], patch_text: str
) -> PortVerdict:
    """Whether ``port`` fits this tree: the same release, the same PR diff, and every target file
    hashing as in the release's wheel. ``file_hashes``: {path: sha256 hex or None (absent)}."""
    if version != port.version:
        return no_port_verdict(version)
    if pr_sha256.lower() != port.pr_diff_sha256:
        return PortVerdict(
            False,
            text=f"the port for SGLang {port.version} is made from PR diff "
            f"{port.pr_diff_sha256[:12]}, settings pin {pr_sha256[:12]}",
            fix=f"set patch.sha256 to {port.pr_diff_sha256} and patch.source to that diff",
        )
    differ = [
        p for p, want in sorted(port.targets.items())
        if (file_hashes.get(p) or "").lower() != want
    ]  # fmt: skip
    if differ:
        return PortVerdict(
            False,
            text=f"no port for this tree: {len(differ)} file(s) differ from the SGLang "
            f"{port.version} wheel ({', '.join(differ[:3])})",
            fix=f"reinstall sglang=={port.version} (pip install --force-reinstall --no-deps) to "
            "use the port, or set sglang.version >= " + V2_BUILTIN_SINCE,
        )
    return PortVerdict(
        True,
        port_id=hashlib.sha256(patch_text.encode()).hexdigest(),
        text=port.describe(),
    )
