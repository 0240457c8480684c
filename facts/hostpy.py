"""Helpers of the Python scripts that facts run on a host, and of reading what they print.

The scripts are run on every host of every deploy, so each import counts: they embed
``installed_dists`` and ``dist_version`` (``host_source``) instead of importing
``importlib.metadata`` (about 40 ms of CPU, four fifths of such a fact), and print ``repr`` of
their value instead of importing ``json``; ``parse_printed`` reads either. A probe runs the
scripts of one interpreter in one process (``PythonJob``, ``RUNNER``).
"""

from __future__ import annotations

from dataclasses import dataclass


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




def host_source(*functions) -> str:
    """The source of ``functions``, for the top of a script run by a host's Python, whatever
    its version: their annotations are not evaluated there."""
    import inspect

    return "from __future__ import annotations\n" + "".join(map(inspect.getsource, functions))


def parse_printed(text: str):
    """The value a host-side script printed: a Python literal (``repr``: such scripts need not
    import ``json``, 7 ms of a 15 ms script) or JSON (older scripts, captured fixtures)."""
    import ast
    import json

    try:
        return json.loads(text)
    except ValueError:
        return ast.literal_eval(text)


@dataclass(frozen=True)
class PythonJob:
    """A fact whose command is one Python script, ``interpreter *flags -c source *argv``, when
    the interpreter is there. A probe runs every such script of one interpreter (and flags) in
    one process (``RUNNER``): one interpreter start, and one ``json`` import, instead of one per
    fact. The fact's ``command`` stays what it runs alone (with what it says when the
    interpreter is missing)."""

    interpreter: str
    flags: tuple[str, ...]
    source: str
    argv: tuple[str, ...] = ()

    def words(self) -> list:
        from pyinfra.api import QuoteString

        return [QuoteString(self.interpreter), *self.flags, "-c", QuoteString(self.source),
                *(QuoteString(a) for a in self.argv)]


# Runs in one interpreter for many PythonJobs. argv: per job OUT_PATH KEY FACT_NAME SOURCE N and
# the job's N arguments. Each job runs as `python -c SOURCE ARGS...` would (its own globals,
# sys.argv, stdout and stderr; sys.path put back after it) and its section is written to
# OUT_PATH in the probe's format: begin line, stdout, a newline, stderr lines, end line.
RUNNER = r"""
import io, sys
MARK = sys.argv[1]
def run(out_path, key, name, source, argv):
    saved = sys.argv, sys.stdout, sys.stderr, list(sys.path)
    out, err = io.StringIO(), io.StringIO()
    sys.argv, sys.stdout, sys.stderr = ["-c", *argv], out, err
    rc = 0
    try:
        exec(compile(source, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=err)
    except BaseException:
        import traceback
        kind, value, tb = sys.exc_info()
        traceback.print_exception(kind, value, tb.tb_next, file=err)  # not the runner's frame
        rc = 1
    finally:
        sys.argv, sys.stdout, sys.stderr = saved[:3]
        sys.path[:] = saved[3]
    lines = [MARK + "-begin " + key + " " + name, out.getvalue()]
    lines += [MARK + "-stderr " + line for line in err.getvalue().splitlines()]
    lines.append(MARK + "-end " + key + " " + str(rc))
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
args = sys.argv[2:]
while args:
    n = int(args[4])
    run(*args[:4], args[5:5 + n])
    args = args[5 + n:]
"""
