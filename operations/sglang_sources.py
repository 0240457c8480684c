"""The upstream text a port's recipe names, fetched on the control machine and checked against
its sha256 pin before a line of it is used (``specfleet.core.sglang.recipe`` puts the files
together). Nothing upstream is stored in this project.

Where each source comes from, first found wins:

1. each folder or URL base in ``patch.source`` (mirrors, for a control machine without the
   internet): a wheel as ``<mirror>/<wheel file>``; the PR head as ``<mirror>/<archive file>``
   (``git archive`` of the commit, as in ``shared/fixtures/sglang-pr20547/``) or as
   ``<mirror>/python/<path>``;
2. the recipe's own URL: the release wheel on PyPI (``files.pythonhosted.org``), the PR head's
   files at their commit on GitHub (``raw.githubusercontent.com``), downloaded once into
   ``~/.cache/specfleet/upstream/`` (named by sha256, checked again on every read).

A source that cannot be reached, or that does not hash as pinned, is a SpecfleetError naming the
URL and the fix, raised while the deploy plans: before anything changes on a host.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from specfleet.core.errors import SpecfleetError

FETCH_TIMEOUT_S = 120
# A whole fetch's deadline, whatever the server trickles, and the most bytes one source may be:
# a release wheel of SGLang is tens of MB, one source file of a commit well under a MB. A
# source may name its own cap (``max_bytes`` in the recipe).
FETCH_DEADLINE_S = 900
MAX_WHEEL_BYTES = 512 << 20
MAX_FILE_BYTES = 16 << 20


def why_unreachable(exc: Exception) -> str:
    """What the server or the network said, in its words: "HTTP 404 Not Found", not urllib's
    class name (a host left without an optional patch is warned, not shown an error)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)


class UpstreamUnreachable(SpecfleetError):
    """A source of the port's upstream text that cannot be reached from the control machine (no
    mirror has it, its URL does not answer): an optional input that a ``--dry`` plan goes on
    without, saying what that changes. A source that answers with other bytes is no such case."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specfleet" / "upstream"


def _is_url(where: str) -> bool:
    return urllib.parse.urlparse(where).scheme in ("http", "https", "file")


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


class UpstreamTooLarge(SpecfleetError):
    """A source that sends more than its cap: not the pinned file, whatever it is."""


def _too_large(url: str, size: int, cap: int) -> UpstreamTooLarge:
    return UpstreamTooLarge(
        f"{url} is {'at least ' if size > cap else ''}{size} bytes, more than the {cap} its "
        "source may be", fix="point patch.source at the real file (or drop it to fetch from the "
        "recipe's own URL)")


def _read_file(path: Path, shown: str, max_bytes: int) -> bytes:
    # Read one byte past the cap from the open file, never sized beforehand: what is read is
    # what was measured, whatever the file becomes meanwhile.
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _too_large(shown, len(data), max_bytes)
    return data


def _read_url(url: str, max_bytes: int = MAX_FILE_BYTES,
              deadline_s: float = FETCH_DEADLINE_S) -> bytes:
    """The bytes at ``url``, streamed: at most ``max_bytes`` (UpstreamTooLarge past them), whole
    within ``deadline_s`` (TimeoutError, an OSError: unreachable)."""
    scheme = urllib.parse.urlparse(url).scheme
    if scheme == "file":
        return _read_file(Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)), url,
                          max_bytes)
    began = time.monotonic()
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310 (pinned)
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise _too_large(url, int(length), max_bytes)
        chunks, got = [], 0
        while chunk := resp.read1(1 << 20):
            got += len(chunk)
            if got > max_bytes:
                raise _too_large(url, got, max_bytes)
            if time.monotonic() - began > deadline_s:
                raise TimeoutError(f"{url} was not whole within {deadline_s:g} s")
            chunks.append(chunk)
        return b"".join(chunks)


class UpstreamSources:
    """A reader of the recipe's source files (``read(name, path) -> text | None``), fetching
    each source once. ``mirrors``: ``patch.source`` (folders on the control machine or URL
    bases), tried before the recipe's own URLs."""

    def __init__(self, sources: Mapping, mirrors: Sequence[str] = (), host: str | None = None,
                 use_cache: bool = True):  # fmt: skip
        self.sources = sources
        self.mirrors = [m for m in mirrors if m]
        self.host = host
        self.use_cache = use_cache
        self._wheels: dict[str, zipfile.ZipFile] = {}
        self._archives: dict[str, dict[str, bytes]] = {}

    def __call__(self, name: str, path: str) -> str | None:
        src = self.sources.get(name)
        if src is None:
            return None
        data = self._wheel_member(name, src, path) if src["kind"] == "wheel" else \
            self._git_file(name, src, path)  # fmt: skip
        if data is None:
            return None
        want = (src.get("files") or {}).get(path)
        if want is not None and hashlib.sha256(data).hexdigest() != want:
            raise self._error(
                f"{name}:{path} from {self._origin(name, src, path)} has sha256 "
                f"{hashlib.sha256(data).hexdigest()}, the port's recipe pins {want}",
                f"point patch.source at the real {self._what(src)} (or drop it to fetch from "
                f"{self._default_url(src, path)})",
            )
        return data.decode("utf-8")

    # -- wheels --------------------------------------------------------------------------------

    def _wheel_member(self, name: str, src: Mapping, path: str) -> bytes | None:
        zf = self._wheels.get(name)
        if zf is None:
            zf = self._wheels[name] = zipfile.ZipFile(io.BytesIO(self._wheel_bytes(name, src)))
        try:
            return zf.read(path)
        except KeyError:
            return None

    def _wheel_bytes(self, name: str, src: Mapping) -> bytes:
        file, want = src["file"], src["sha256"]
        tried = []
        for mirror in self.mirrors:
            where = _join(mirror, file) if _is_url(mirror) else \
                str(Path(mirror).expanduser() / file)  # fmt: skip
            data = self._try(where, tried, int(src.get("max_bytes") or MAX_WHEEL_BYTES))
            if data is not None:
                return self._checked(data, want, where, src)
        cached = cache_dir() / want
        if self.use_cache and cached.is_file():
            data = cached.read_bytes()
            if hashlib.sha256(data).hexdigest() == want:
                return data
        url = self._default_url(src, "")
        try:
            data = _read_url(url, int(src.get("max_bytes") or MAX_WHEEL_BYTES))
        except OSError as exc:
            raise self._unreachable(url, exc, src, tried) from None
        self._checked(data, want, url, src)
        if self.use_cache:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".part")
            tmp.write_bytes(data)
            tmp.replace(cached)
        return data

    # -- a git commit's files --------------------------------------------------------------------

    def _git_file(self, name: str, src: Mapping, path: str) -> bytes | None:
        tried = []
        archive = (src.get("archive") or {}).get("file")
        for mirror in self.mirrors:
            if _is_url(mirror):
                data = self._try(_join(mirror, f"python/{path}"), tried)
                if data is not None:
                    return data
                continue
            root = Path(mirror).expanduser()
            if archive and (root / archive).is_file():
                files = self._archive(root / archive)
                # The commit's whole tree: a path it lacks is not at that commit.
                return files.get(path)
            data = self._try(str(root / "python" / path), tried)
            if data is not None:
                return data
        url = self._default_url(src, path)
        try:
            return _read_url(url)
        except OSError as exc:
            raise self._unreachable(url, exc, src, tried) from None

    def _archive(self, file: Path) -> dict[str, bytes]:
        key = str(file)
        if key not in self._archives:
            out = {}
            with tarfile.open(file) as tar:
                for member in tar.getmembers():
                    _, _, rel = member.name.partition("/python/")  # <prefix>/python/sglang/...
                    if member.isfile() and rel:
                        out[rel] = tar.extractfile(member).read()
            self._archives[key] = out
        return self._archives[key]

    # -- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _try(where: str, tried: list[str], max_bytes: int = MAX_FILE_BYTES) -> bytes | None:
        try:
            if _is_url(where):
                return _read_url(where, max_bytes)
            return _read_file(Path(where), where, max_bytes)
        except (OSError, ValueError) as exc:
            tried.append(f"{where} ({type(exc).__name__})")
            return None

    def _checked(self, data: bytes, want: str, where: str, src: Mapping) -> bytes:
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise self._error(
                f"{where} has sha256 {got}, the port's recipe pins {want} ({src['file']})",
                f"point patch.source at a folder holding the real {src['file']}, or drop it to "
                f"fetch {self._default_url(src, '')}",
            )
        return data

    @staticmethod
    def _default_url(src: Mapping, path: str) -> str:
        return src["url"].format(file=src.get("file", ""), commit=src.get("commit", ""),
                                 path=path)  # fmt: skip

    def _origin(self, name: str, src: Mapping, path: str) -> str:
        return ", ".join(self.mirrors) or self._default_url(src, path)

    @staticmethod
    def _what(src: Mapping) -> str:
        if src["kind"] == "wheel":
            return src["file"]
        return f"{src['repo']} {src['commit'][:12]} ({(src.get('archive') or {}).get('file')})"

    def _unreachable(self, url: str, exc: Exception, src: Mapping, tried: list[str]):
        also = f"; not in patch.source: {', '.join(tried)}" if tried else ""
        return UpstreamUnreachable(
            f"cannot fetch {url} ({why_unreachable(exc)}){also}: the PR#20547 port takes "
            "upstream text from it, pinned by sha256, and this project carries none",
            host=self.host,
            fix=f"let the control machine reach {urllib.parse.urlparse(url).netloc}, or copy "
            f"{self._what(src)} into a folder and set patch.source to it",
        )

    def _error(self, text: str, fix: str) -> SpecfleetError:
        return SpecfleetError(text, host=self.host, fix=fix)
