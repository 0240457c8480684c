"""Helpers of the Python scripts that facts run on a host, and of reading what they print.

The scripts are run on every host of every deploy, so each import counts: they embed
``installed_dists`` (``inspect.getsource``) instead of importing ``importlib.metadata`` (about
40 ms of CPU, four fifths of such a fact), and print ``repr`` of their value instead of
importing ``json``; ``parse_printed`` reads either.
"""

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


def parse_printed(text: str):
    """The value a host-side script printed: a Python literal (``repr``: such scripts need not
    import ``json``, 7 ms of a 15 ms script) or JSON (older scripts, captured fixtures)."""
    import ast
    import json

    try:
        return json.loads(text)
    except ValueError:
        return ast.literal_eval(text)
