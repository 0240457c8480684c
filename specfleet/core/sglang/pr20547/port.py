"""The port of PR#20547's DFlash v2 worker onto released SGLang wheels, kept as data.

A port is a folder under ``specfleet/patchdata/pr20547/sglang-<version>/``:

- ``port.json``: the key (the PR revision's sha256, the SGLang version, the sha256 of every file
  the port modifies and of the files it relies on unchanged, the files it creates);
- ``recipe.json``: which upstream text makes each file, from sources pinned by sha256, and the
  lines this project wrote (``specfleet.core.sglang.recipe``); no upstream text is stored;
- ``provenance.json``: why each file of the recipe is what it is;
- ``NOTICE``: the Apache-2.0 notice of the upstream code the deploy fetches.

Everything here is pure text handling except :func:`load_ports`, the one function that reads (the
data folder, found with ``importlib.resources``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources

from specfleet.core.sglang.patch import HUNK_RE, filter_patch, split_sections

PATCHDATA_PACKAGE = "specfleet.patchdata"
PR20547_DIR = "pr20547"
PORT_FILE = "port.json"
# How port.json writes the sha256 of a file: lowercase hex, what ``sha256sum`` prints. (A wheel's
# RECORD has the same digest as urlsafe base64 without padding.)
HASH_FORMAT = "sha256-hex"

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class PortError(ValueError):
    """A port's data that does not fit what this module expects."""


# --------------------------------------------------------------------------------------------------
# Hunks of a unified diff
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hunk:
    """One hunk of a (git-style or plain) unified diff, with the header of its file."""

    index: int  # over the whole diff, counting from 0
    path: str  # the new path (the old one for a deletion), e.g. sglang/srt/environ.py
    file_header: tuple[str, ...]  # diff --git / index / new file mode / --- / +++
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str  # what follows the second @@ (a function name)
    lines: tuple[str, ...]  # the body, each with its newline and its leading " ", "-", "+", "\"

    @property
    def added(self) -> list[str]:
        """The added lines' text, without the ``+`` and the line end."""
        return [ln[1:].rstrip("\r\n") for ln in self.lines if ln.startswith("+")]

    @property
    def removed(self) -> list[str]:
        return [ln[1:].rstrip("\r\n") for ln in self.lines if ln.startswith("-")]

    @property
    def creates(self) -> bool:
        return any(ln.startswith("--- /dev/null") for ln in self.file_header)

    def header(self, new_start: int | None = None) -> str:
        start = self.new_start if new_start is None else new_start
        return f"@@ -{self.old_start},{self.old_len} +{start},{self.new_len} @@{self.section}\n"


def split_hunks(text: str) -> list[Hunk]:
    """Every hunk of a unified diff whose paths carry ``a/`` and ``b/`` (``-p1``), in order (read
    by ``specfleet.core.sglang.patch.split_sections``, the one diff reader)."""
    hunks: list[Hunk] = []
    for sec in split_sections(text):
        if not sec.hunk_at:
            continue
        header = sec.lines[: sec.hunk_at[0]]
        path = sec.new or sec.old or ""
        for k, at in enumerate(sec.hunk_at):
            end = sec.hunk_at[k + 1] if k + 1 < len(sec.hunk_at) else len(sec.lines)
            m = HUNK_RE.match(sec.lines[at])
            hunks.append(Hunk(
                index=len(hunks), path=path, file_header=tuple(header),
                old_start=int(m.group(1)),
                old_len=int(m.group(2)) if m.group(2) is not None else 1,
                new_start=int(m.group(3)),
                new_len=int(m.group(4)) if m.group(4) is not None else 1,
                section=m.group(5).rstrip("\r\n"), lines=tuple(sec.lines[at + 1 : end]),
            ))  # fmt: skip
    return hunks


def join_hunks(hunks: Iterable[Hunk]) -> str:
    """A patch of the given hunks (of one diff, in its order): each file's header once, and the
    new-side start lines recomputed so that they agree with the hunks left out."""
    out: list[str] = []
    last_path: str | None = None
    delta = 0
    for h in hunks:
        if h.path != last_path:
            out.extend(h.file_header)
            last_path, delta = h.path, 0
        start = h.old_start + delta if h.old_len else h.old_start + delta + 1
        if h.old_start == 0 and h.old_len == 0:
            start = 1 if h.new_len else 0
        out.append(h.header(start))
        out.extend(h.lines)
        delta += h.new_len - h.old_len
    return "".join(out)


def select_pr_hunks(pr_diff: str, indexes: Iterable[int]) -> str:
    """The PR diff mapped onto site-packages (``python/sglang/`` -> ``sglang/``, as
    :func:`filter_patch` does), cut down to the hunks at ``indexes`` (over the whole diff, from 0,
    strictly increasing)."""
    wanted = list(indexes)
    if wanted != sorted(set(wanted)):
        raise PortError(f"PR hunk indexes must be strictly increasing: {wanted}")
    hunks = split_hunks(filter_patch(pr_diff).text)
    if wanted and (wanted[0] < 0 or wanted[-1] >= len(hunks)):
        raise PortError(f"PR hunk indexes out of range 0..{len(hunks) - 1}: {wanted}")
    return join_hunks(hunks[i] for i in wanted)


# --------------------------------------------------------------------------------------------------
# The key: which port fits a tree
# --------------------------------------------------------------------------------------------------


def check_port(port: Mapping) -> list[str]:
    """What is wrong with a loaded ``port.json`` (empty when nothing)."""
    problems = []
    for field in ("pr_diff_sha256", "sglang_version", "targets", "recipe"):
        if field not in port:
            problems.append(f"missing {field}")
    if port.get("hash") != HASH_FORMAT:
        problems.append(f"hash is {port.get('hash')!r}, not {HASH_FORMAT!r}")
    for field in ("targets", "requires"):
        for path, digest in (port.get(field) or {}).items():
            if not isinstance(digest, str) or not _SHA256_RE.match(digest):
                problems.append(f"{field}[{path}] is not a lowercase hex sha256: {digest!r}")
    if not _SHA256_RE.match(str(port.get("pr_diff_sha256", ""))):
        problems.append("pr_diff_sha256 is not a lowercase hex sha256")
    return problems


def port_matches(
    port: Mapping, version: str, pr_diff_sha256: str, file_hashes: Mapping[str, str | None]
) -> bool:
    """Whether ``port`` (a loaded ``port.json``) fits a tree: the same SGLang version and PR diff,
    every file it modifies or relies on with the recorded sha256, and none of the files it creates
    already there. ``file_hashes``: ``{path under site-packages: sha256 hex, or None: absent}``."""
    if port.get("sglang_version") != version or port.get("pr_diff_sha256") != pr_diff_sha256:
        return False
    for field in ("targets", "requires"):
        for path, digest in (port.get(field) or {}).items():
            if file_hashes.get(path) != digest:
                return False
    return all(file_hashes.get(path) is None for path in port.get("creates") or ())


def port_for(
    version: str,
    pr_diff_sha256: str,
    file_hashes: Mapping[str, str | None],
    ports: Mapping[str, Mapping],
) -> str | None:
    """The port (its key in ``ports``, a data folder such as ``pr20547/sglang-0.5.11``) that fits
    the tree, or None: no port for this tree. ``ports`` is what :func:`load_ports` returns; this
    function reads nothing itself."""
    for name in sorted(ports):
        if port_matches(ports[name], version, pr_diff_sha256, file_hashes):
            return name
    return None


def hashed_paths(port: Mapping) -> list[str]:
    """The files whose sha256 a caller needs for :func:`port_for`: those the port modifies, relies
    on, or creates."""
    names = set(port.get("targets") or {}) | set(port.get("requires") or {})
    return sorted(names | set(port.get("creates") or ()))


# --------------------------------------------------------------------------------------------------
# The data (the one reader here)
# --------------------------------------------------------------------------------------------------


def load_ports(package: str = PATCHDATA_PACKAGE) -> dict[str, dict]:
    """``{"pr20547/sglang-0.5.11": port.json's contents, ...}`` for every port shipped in
    ``package`` (found with ``importlib.resources``: a wheel's package data or a checkout)."""
    root = resources.files(package) / PR20547_DIR
    out: dict[str, dict] = {}
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        spec = folder / PORT_FILE
        if folder.is_dir() and spec.is_file():
            port = json.loads(spec.read_text(encoding="utf-8"))
            problems = check_port(port)
            if problems:
                raise PortError(f"{PR20547_DIR}/{folder.name}/{PORT_FILE}: {'; '.join(problems)}")
            out[f"{PR20547_DIR}/{folder.name}"] = port
    return out


def read_port_file(name: str, file: str, package: str = PATCHDATA_PACKAGE) -> str:
    """The text of ``file`` (``recipe.json``, ``NOTICE``...) in the port ``name``."""
    return (resources.files(package).joinpath(*name.split("/"), file)).read_text(encoding="utf-8")
