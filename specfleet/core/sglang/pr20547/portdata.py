"""The verdict on a port of PR#20547 for one host's tree, and the one diff it applies. Pure: the
port's data comes from ``specfleet.core.sglang.pr20547.port`` (``port.json``, ``recipe.json``),
the upstream text from a reader the caller passes (``operations.sglang_sources``), and the host's
file hashes from ``facts.sglang.FileHashes``.

A tree whose files do not hash as the port's release wheel gets "no port for this tree" and keeps
v1: a port is never applied fuzzily (``--fuzz=0``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from specfleet.core.sglang.patch import FilteredPatch, filter_patch
from specfleet.core.sglang.pr20547.decision import PortVerdict
from specfleet.core.sglang.pr20547.port import hashed_paths, port_matches
from specfleet.core.sglang.recipe import SourceReader, build, count_taken
from specfleet.core.tables.sglang_versions import V2_BUILTIN_SINCE

# Releases with a port (specfleet/patchdata/pr20547/sglang-<version>/).
PORTED_RELEASES = ("0.5.11",)


@dataclass(frozen=True)
class Port:
    name: str  # pr20547/sglang-0.5.11
    data: Mapping  # port.json
    recipe: Mapping  # recipe.json

    @property
    def version(self) -> str:
        return str(self.data["sglang_version"])

    @property
    def hashed_paths(self) -> list[str]:
        return hashed_paths(self.data)

    @property
    def sources(self) -> Mapping:
        """The upstream sources the recipe names (for ``operations.sglang_sources``)."""
        return self.recipe["sources"]

    def patch(self, read: SourceReader) -> FilteredPatch:
        """The one diff this port applies: the release's files to the files the recipe makes
        from the sources ``read`` gives (each checked against its sha256 pin)."""
        return filter_patch(build(self.recipe, read).diff(), site_paths=True)

    def describe(self) -> str:
        taken = count_taken(self.recipe)
        # Lines of the release's own files that stay are not counted: they are the host's.
        upstream = sum(n for name, n in taken.items() if name not in ("own", self.recipe["base"]))
        return (
            f"the PR#20547 port for SGLang {self.version} ({len(self.recipe['files'])} files from "
            f"its recipe: {upstream} lines of pinned upstream sources, {taken.get('own', 0)} "
            "of this project's)"
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
    """Whether ``port`` fits this tree: the same release and PR diff, every file it modifies or
    relies on hashing as in the release's wheel, and none it creates already there.
    ``file_hashes``: {path: sha256 hex or None (absent)}."""
    data = port.data
    if version != port.version:
        return no_port_verdict(version)
    if pr_sha256.lower() != data["pr_diff_sha256"]:
        return PortVerdict(
            False,
            text=f"the port for SGLang {port.version} is made from PR diff "
            f"{data['pr_diff_sha256'][:12]}, settings pin {pr_sha256[:12]}",
            fix=f"set patch.sha256 to {data['pr_diff_sha256']} (the PR revision of this port)",
        )
    if not port_matches(data, version, pr_sha256.lower(), file_hashes):
        expected = {**(data.get("targets") or {}), **(data.get("requires") or {})}
        differ = [p for p, h in sorted(expected.items()) if file_hashes.get(p) != h]
        differ += [p for p in data.get("creates") or () if file_hashes.get(p) is not None]
        return PortVerdict(
            False,
            text=f"no port for this tree: {len(differ)} file(s) differ from the SGLang "
            f"{port.version} wheel ({', '.join(differ[:3])})",
            fix=f"reinstall sglang=={port.version} (pip install --force-reinstall --no-deps) to "
            f"use the port, or set sglang.version >= {V2_BUILTIN_SINCE}",
        )
    return PortVerdict(
        True, port_id=hashlib.sha256(patch_text.encode()).hexdigest(), text=port.describe()
    )


def predicted_hashes(port: Port) -> dict[str, str | None]:
    """The file hashes a fresh install of the port's release will have (``--dry``)."""
    data = port.data
    out: dict[str, str | None] = {**(data.get("targets") or {}), **(data.get("requires") or {})}
    out.update({p: None for p in data.get("creates") or ()})
    return out
