"""Many facts in one shell command per host; each fact's parser gets its own slice."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyinfra.api import FactBase, StringCommand
from typing_extensions import override

from facts.disk import FreeSpace
from facts.gpu import GpuProcesses, Gpus, GpuTopology
from facts.hf import Token
from facts.net import ListeningPorts
from facts.python import Packages
from facts.sglang import DEFAULT_PYTHON, SGLangInstall
from specfleet.core.errors import SpecfleetError

MARK = "##specfleet-probe"
MISSING = "##specfleet-probe-missing-command"

# A spec: a fact class, with optional kwargs. Classes are imported, never named by a string
# (tests/unit/test_floors.py): the floor plan sees every fact a probe reads.
Spec = Any

# The facts a probe's output names (its sections carry ``cls.name``), for reading it back: the
# default specs' classes, and every class a probe command of this process was built with.
_KNOWN: dict[str, type[FactBase]] = {}


def default_specs(
    python: str = DEFAULT_PYTHON,
    models_path: str = "/srv/models",
    token_path: str | None = None,
) -> dict[str, tuple[type[FactBase], dict]]:
    """The facts a specfleet deploy and preflight read, keyed by fact name (as
    ``specfleet.core.plan`` and ``pyinfra fact --json`` key them)."""
    specs: dict[str, tuple[type[FactBase], dict]] = {}
    for cls, kwargs in (
        (Gpus, {}), (GpuTopology, {}), (GpuProcesses, {}), (FreeSpace, {"path": models_path}),
        (SGLangInstall, {"python": python}), (Packages, {"python": python}),
        (Token, {"path": token_path}), (ListeningPorts, {}),
    ):  # fmt: skip
        specs[cls.name] = (cls, kwargs)
    return specs


def fact_class(name_or_class: str | type[FactBase]) -> type[FactBase]:
    """A fact class as given, or the class a probe's output names (``"facts.gpu.Gpus"``): one of
    the default specs' or one a probe command of this process was built with."""
    if isinstance(name_or_class, type) and issubclass(name_or_class, FactBase):
        _KNOWN.setdefault(name_or_class.name, name_or_class)
        return name_or_class
    cls = _KNOWN.get(name_or_class) or {c.name: c for c, _ in default_specs().values()}.get(
        name_or_class
    )
    if cls is None:
        raise ValueError(f"no fact named {name_or_class!r}: give the fact's class")
    return cls


def _normalise(specs: Mapping[str, Spec]) -> dict[str, tuple[type[FactBase], dict]]:
    out = {}
    for key, spec in specs.items():
        if " " in key or not key:
            raise ValueError(f"probe key {key!r} must be one word")
        target, kwargs = spec if isinstance(spec, (tuple, list)) else (spec, {})
        out[key] = (fact_class(target), dict(kwargs or {}))
    return out


def _shell(command: Any) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def probe_command(specs: Mapping[str, Spec]) -> str:
    """One POSIX shell command running every fact's command in turn.

    Per fact: a begin line naming the key and fact, the fact's stdout, its stderr (each line
    prefixed), and an end line with the exit status. The command itself always exits 0.
    """
    parts = ['e=$(mktemp 2>/dev/null || echo "/tmp/specfleet-probe.$$")']
    for key, (cls, kwargs) in _normalise(specs).items():
        fact = cls()
        command = fact.command(**kwargs) if callable(fact.command) else fact.command
        command = _shell(command)
        required = fact.requires_command(**kwargs)
        if required:
            command = (
                f"if command -v {required} >/dev/null 2>&1; then ({command}); "
                f"else echo '{MISSING}'; fi"
            )
        parts.append(
            f"echo '{MARK}-begin {key} {cls.name}'; ( {command} ) 2>\"$e\"; rc=$?; echo; "
            f'! test -s "$e" || sed \'s/^/{MARK}-stderr /\' "$e"; echo "{MARK}-end {key} $rc"'
        )
    parts.append('rm -f "$e"; true')
    return "; ".join(parts)


def split_probe_output(output: list[str]) -> dict[str, dict]:
    """Cut the probe's output into ``{key: {"fact", "stdout", "stderr", "rc"}}``."""
    sections: dict[str, dict] = {}
    current: dict | None = None
    for line in output:
        if line.startswith(f"{MARK}-begin "):
            _, key, name = line.split(" ", 2)
            current = sections[key] = {"fact": name, "stdout": [], "stderr": [], "rc": None}
        elif current is None:
            continue
        elif line.startswith(f"{MARK}-stderr "):
            current["stderr"].append(line[len(MARK) + 8 :])
        elif line.startswith(f"{MARK}-end "):
            current["rc"] = int(line.rsplit(" ", 1)[1])
            # The newline echoed after the fact's output: a fact that ended its output with a
            # newline leaves one empty line here, one that did not leaves none.
            if current["stdout"] and current["stdout"][-1] == "":
                current["stdout"].pop()
            current = None
        else:
            current["stdout"].append(line)
    return sections


def section_value(fact: FactBase, section: dict | None) -> tuple[Any, str | None]:
    """One probe section through its fact's own ``process`` (or ``default``): (value, error)."""
    if section is None or section["rc"] is None:
        return fact.default(), "the probe ended before this fact finished"
    stdout = section["stdout"]
    if section["rc"] != 0:
        text = "\n".join(section["stderr"]) or "\n".join(stdout)
        return fact.default(), f"exit status {section['rc']}: {text}".rstrip(": ")
    if stdout == [MISSING] or not stdout:
        return fact.default(), None
    try:
        return fact.process(stdout), None
    except Exception as exc:  # noqa: BLE001 - reported per fact, the others still count
        return fact.default(), f"{type(exc).__name__}: {exc}"


def parse_probe(output: list[str]) -> dict:
    """Each section through its fact's own ``process`` (or ``default``)."""
    facts: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key, section in split_probe_output(output).items():
        facts[key], error = section_value(fact_class(section["fact"])(), section)
        if error:
            errors[key] = error
    return {"facts": facts, "errors": errors}


class Probe(FactBase[dict]):
    """
    Returns many facts from one command: ``facts`` holds each fact's value under its key,
    ``errors`` the facts whose command failed (their value is the fact's default). Without
    ``specs``, the facts of ``default_specs(python, models_path, token_path)``.

    + specs: ``{key: FactClass | (FactClass, {kwargs})}``
    + python: the SGLang venv's interpreter (default specs)
    + models_path: where the weights go (default specs)
    + token_path: the host's Hugging Face token file, if not huggingface_hub's default

    .. code:: python

        {
            "facts": {
                "facts.gpu.Gpus": {"gpus": [...], "error": None},
                "facts.sglang.SGLangInstall": None,
                ...
            },
            "errors": {},
        }
    """

    @staticmethod
    def default() -> dict:
        return {"facts": {}, "errors": {}}

    @override
    def command(
        self,
        specs: Mapping[str, Spec] | None = None,
        python: str = DEFAULT_PYTHON,
        models_path: str = "/srv/models",
        token_path: str | None = None,
    ) -> str:
        return probe_command(specs or default_specs(python, models_path, token_path))

    @override
    def process(self, output: list[str]) -> dict:
        return parse_probe(output)


def gather(host, specs: Mapping[str, Spec] | None = None, **kwargs) -> dict[str, Any]:
    """``host.get_fact(Probe, ...)`` -> ``{key: value}``; a failed fact raises SpecfleetError."""

    value = host.get_fact(Probe, specs=specs, **kwargs)
    if value["errors"]:
        first = next(iter(value["errors"].items()))
        raise SpecfleetError(
            f"reading host facts failed: {first[0]}: {first[1]}",
            host=host.name,
            fix="run `pyinfra INVENTORY fact facts.probe.Probe` and fix the command it reports",
        )
    return value["facts"]


def describe_host(probe_value: Mapping, name: str = "") -> str:
    """A short human summary of one host's probe value (``Probe`` or its ``facts``)."""
    facts = probe_value.get("facts", probe_value)
    errors = probe_value.get("errors", {}) if "facts" in probe_value else {}
    lines = [f"{name}:" if name else "host:"]

    gpus = facts.get("facts.gpu.Gpus") or {}
    if gpus.get("gpus"):
        kinds: dict[tuple, int] = {}
        for g in gpus["gpus"]:
            kind = (g.get("name"), g.get("compute_capability"), g.get("memory_mib"))
            kinds[kind] = kinds.get(kind, 0) + 1
        desc = ", ".join(
            f"{n}x {name_} (sm {cap or '?'}, {mem or '?'} MiB)"
            for (name_, cap, mem), n in kinds.items()
        )
        driver = gpus["gpus"][0].get("driver")
        lines.append(f"  gpus: {desc}, driver {driver}")
    else:
        lines.append("  gpus: none" + ("" if "facts.gpu.Gpus" in facts else " (not read)"))
    if gpus.get("error"):
        lines.append(f"  gpu error: {gpus['error']}")

    topo = facts.get("facts.gpu.GpuTopology") or {}
    if topo.get("gpus"):
        links = sorted({t for row in topo.get("links", {}).values() for t in row.values()})
        all_nv = "yes" if topo.get("nvlink_all_pairs") else "no"
        lines.append(f"  topology: links {'/'.join(links) or '-'}, NVLink all pairs: {all_nv}")
    elif topo.get("error"):
        lines.append(f"  topology: unknown ({topo['error'].splitlines()[0]})")

    busy = (facts.get("facts.gpu.GpuProcesses") or {}).get("processes") or []
    if busy:
        procs = ", ".join(f"pid {p['pid']} {p['used_memory_mib']} MiB" for p in busy)
        lines.append(f"  gpu processes: {procs}")

    disk = facts.get("facts.disk.FreeSpace")
    if disk:
        if disk.get("free_bytes") is not None:
            lines.append(
                f"  disk {disk.get('path')}: {disk['free_bytes'] / 2**30:.1f} GiB free of "
                f"{disk['total_bytes'] / 2**30:.1f} GiB (mount {disk.get('mount')})"
            )
        else:
            lines.append(f"  disk {disk.get('path')}: unknown ({disk.get('error')})")

    if "facts.sglang.SGLangInstall" in facts:
        install = facts["facts.sglang.SGLangInstall"]
        if install:
            feats = install.get("features") or {}
            on = [k for k, v in feats.items() if v and v is not True] + [
                k for k, v in feats.items() if v is True
            ]
            lines.append(
                f"  sglang: {install.get('version')} at {install.get('location')}; "
                f"dflash {feats.get('dflash') or 'no'}; features: {', '.join(on) or '-'}"
            )
            lines.append(
                f"    speculative: {' '.join(install.get('speculative_algorithms') or [])}"
            )
            lines.append(
                f"    attention backends ({len(install.get('attention_backends') or [])}): "
                f"{' '.join(install.get('attention_backends') or [])}"
            )
        else:
            lines.append("  sglang: not installed")

    packages = facts.get("facts.python.Packages")
    if packages:
        versions = {
            k: v for k, v in packages.items() if k not in ("direct_urls", "python_version") and v
        }
        py = packages.get("python_version") or "absent"
        listed = ", ".join(f"{k} {v}" for k, v in versions.items()) or "none of interest"
        lines.append(f"  python {py}: {listed}")
        for dist, url in (packages.get("direct_urls") or {}).items():
            lines.append(f"    {dist} from {url.get('url')} @ {url.get('commit') or '-'}")

    token = facts.get("facts.hf.Token")
    if token:
        lines.append(
            f"  hf token: {'present' if token.get('exists') else 'absent'} ({token['path']})"
        )

    listeners = facts.get("facts.net.ListeningPorts")
    if listeners:
        ports = sorted({(e["port"], e.get("process") or "?") for e in listeners})
        lines.append("  listening: " + ", ".join(f"{p} ({proc})" for p, proc in ports))

    for key, error in errors.items():
        lines.append(f"  ERROR {key}: {error}")
    return "\n".join(lines)


def describe_json(values: Mapping[str, Mapping]) -> str:
    """Every host's summary, from ``{host: probe value}``."""
    return "\n\n".join(describe_host(v, name) for name, v in values.items())


def probe_inventory(inventory: str, *fact_args: str) -> dict[str, dict]:
    """Run ``pyinfra INVENTORY fact facts.probe.Probe ARGS --json``; ``{host: probe value}``."""
    import os
    import subprocess
    import sys

    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    done = subprocess.run(
        [pyinfra, inventory, "fact", "facts.probe.Probe", *fact_args, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    start = done.stdout.find("{")
    if done.returncode != 0 or start < 0:
        raise RuntimeError(f"pyinfra failed ({done.returncode}):\n{done.stderr or done.stdout}")
    data = json.loads(done.stdout[start : done.stdout.rindex("}") + 1])
    return next(iter(data.values())) if data else {}


def main(argv: list[str]) -> int:
    """``python -m facts.probe INVENTORY [python=... models_path=... token_path=...]`` prints every
    host's facts; ``python -m facts.probe --json-file probe.json`` renders a saved ``--json``."""
    if len(argv) >= 2 and argv[0] == "--json-file":
        with open(argv[1], encoding="utf-8") as f:
            data = json.load(f)
        values = next(iter(data.values())) if "facts.probe.Probe" in next(iter(data), "") else data
    elif argv:
        values = probe_inventory(argv[0], *argv[1:])
    else:
        print(main.__doc__)
        return 2
    print(describe_json(values))
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main(sys.argv[1:]))
