"""Installed distributions read from their metadata files, as ``importlib.metadata`` finds
them, without importing it (about 40 ms of CPU on a host, four fifths of a small fact). Stdlib
only: fact scripts carry these functions inline (``# needs:``)."""

from __future__ import annotations


def installed_dists(paths: list[str]) -> dict[str, dict]:
    """``{Name: {"version", "direct_url"}}`` of every ``*.dist-info``/``*.egg-info`` under
    ``paths``, the first of a name winning, as ``importlib.metadata.distributions()`` finds
    them on ``sys.path``. ``direct_url`` is the raw text of ``direct_url.json``, or None."""
    import os as _os

    def _read(path):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    dists = {}
    for base in paths:
        base = base or "."
        try:
            entries = sorted(_os.listdir(base))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith((".dist-info", ".egg-info")):
                continue
            path = _os.path.join(base, entry)
            is_dir = _os.path.isdir(path)
            name_file = "METADATA" if entry.endswith(".dist-info") else "PKG-INFO"
            text = _read(_os.path.join(path, name_file) if is_dir else path)
            if text is None:
                continue
            headers = {}
            for line in text.split("\n"):
                if not line.strip():
                    break  # the body starts after the first blank line
                key, sep, value = line.partition(":")
                if sep and key in ("Name", "Version") and key not in headers:
                    headers[key] = value.strip()
            name = headers.get("Name")
            if not name or name in dists:
                continue
            direct = _read(_os.path.join(path, "direct_url.json")) if is_dir else None
            dists[name] = {"version": headers.get("Version"), "direct_url": direct}
    return dists


def dist_version(paths: list[str], name: str) -> str | None:
    """The version of the first distribution called ``name`` under ``paths`` (case, ``-``,
    ``_`` and ``.`` alike), as ``importlib.metadata.version`` finds it, or None."""

    def _canonical(n):
        return n.lower().replace("_", "-").replace(".", "-")

    return next((d["version"] for n, d in installed_dists(paths).items()
                 if _canonical(n) == _canonical(name)), None)


def site_paths() -> list[str]:
    """The folders ``site`` would put on ``sys.path`` for this interpreter, found without running
    any of them: the fact scripts run with ``-I -S``, so that no ``.pth`` file's ``import`` line
    (code, which ``site`` runs as the interpreter starts) runs as root. As ``site`` does: a venv's
    site-packages (its ``pyvenv.cfg`` beside or above the interpreter), then, unless that venv
    says ``include-system-site-packages = false``, the base interpreter's; each followed by the
    folders its ``.pth`` files name on their path lines (those that exist); ``import`` lines are
    skipped, never run (``editable_packages`` reads what setuptools' editable finders map)."""
    import os as _os
    import site as _site  # under -S importing site runs nothing (only site.main() would)
    import sys as _sys

    exe_dir = _os.path.dirname(_os.path.abspath(_sys.executable))
    venv = _os.path.dirname(exe_dir)
    conf = next((c for c in (_os.path.join(exe_dir, "pyvenv.cfg"),
                             _os.path.join(venv, "pyvenv.cfg")) if _os.path.isfile(c)), None)
    bases = [_sys.base_prefix, _sys.base_exec_prefix]
    dirs = []
    if conf is None:
        dirs += _site.getsitepackages(bases)
    else:
        system = "true"
        with open(conf, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    system = value.strip().lower()
        # A venv's own folders as stock site.py lays them out (before 3.11, or under -S, a
        # distribution's patched getsitepackages may not know the interpreter is in a venv).
        version = f"python{_sys.version_info[0]}.{_sys.version_info[1]}"
        for lib in dict.fromkeys([getattr(_sys, "platlibdir", "lib"), "lib"]):
            dirs.append(_os.path.join(venv, lib, version, "site-packages"))
        if system == "true":
            dirs += _site.getsitepackages(bases)
    out = []
    for sitedir in dirs:
        if not _os.path.isdir(sitedir) or sitedir in out:
            continue
        out.append(sitedir)
        try:
            names = sorted(n for n in _os.listdir(sitedir)
                           if n.endswith(".pth") and not n.startswith("."))
        except OSError:
            continue
        for name in names:
            try:
                with open(_os.path.join(sitedir, name), encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            for line in lines:
                if not line.strip() or line.startswith(("#", "import ", "import\t")):
                    continue
                path = _os.path.abspath(_os.path.join(sitedir, line.rstrip()))
                if path not in out and _os.path.exists(path):
                    out.append(path)
    return out


def editable_packages(paths: list[str]) -> dict[str, str]:
    """``{top-level package: folder}`` of setuptools' editable installs (``pip install -e``)
    under ``paths``: the ``MAPPING`` line of each ``__editable___*_finder.py`` that a ``.pth``
    file's ``import`` line names, read as a literal, never run (``site_paths``)."""
    import ast as _ast
    import os as _os
    import re as _re

    found = {}
    for base in paths:
        try:
            names = sorted(n for n in _os.listdir(base)
                           if n.endswith(".pth") and not n.startswith("."))
        except OSError:
            continue
        for name in names:
            try:
                with open(_os.path.join(base, name), encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            for finder in _re.findall(r"^import\s+(__editable___\w+_finder)\b", text, _re.M):
                try:
                    with open(_os.path.join(base, finder + ".py"), encoding="utf-8") as f:
                        source = f.read()
                except (OSError, UnicodeDecodeError):
                    continue
                m = _re.search(r"^MAPPING(?:\s*:[^=\n]*)?\s*=\s*(\{.*\})\s*$", source, _re.M)
                try:
                    mapping = _ast.literal_eval(m.group(1)) if m else {}
                except (ValueError, SyntaxError):
                    continue
                for package, folder in (mapping if isinstance(mapping, dict) else {}).items():
                    if isinstance(package, str) and "." not in package \
                            and isinstance(folder, str):
                        found.setdefault(package, folder)
    return found
