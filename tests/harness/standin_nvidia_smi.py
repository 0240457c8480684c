#!/usr/bin/python3 -IS
"""STAND-IN for nvidia-smi on the test fleet's hosts (there are no GPUs here).

It replays real captured output of one machine type, a "profile": a folder of
tests/fixtures/nvidia/<profile>/ (format: tests/fixtures/nvidia/README.md), bind-mounted read-only
at /usr/local/share/standin-nvidia-smi on the host. It never invents values: a command with no
capture and no real value to answer from fails loudly (exit 97), so a test cannot pass on made-up
output.

Runtime state a test may set on a host (simulates a busy GPU):
  /run/standin-nvidia-smi/compute-apps.csv  rows "gpu_index, pid, used_memory_mib, process_name"

On fleet hosts it runs behind standin_nvidia_smi_replay.sh (/usr/local/bin/nvidia-smi), which
replays an answer given before to the same arguments (kept under /run/standin-nvidia-smi/replay).
"""

from __future__ import annotations

import json
import os
import sys

PROFILE_DIR = os.environ.get("STANDIN_NVIDIA_SMI_PROFILE", "/usr/local/share/standin-nvidia-smi")
RUNTIME_DIR = os.environ.get("STANDIN_NVIDIA_SMI_RUNTIME", "/run/standin-nvidia-smi")
NO_CAPTURE_EXIT = 97

# Valid --query-compute-apps fields and the header nvidia-smi prints for them (real names).
COMPUTE_APP_FIELDS = {
    "pid": "pid",
    "process_name": "process_name",
    "name": "process_name",
    "used_memory": "used_gpu_memory [MiB]",
    "used_gpu_memory": "used_gpu_memory [MiB]",
    "gpu_bus_id": "gpu_bus_id",
    "gpu_uuid": "gpu_uuid",
}


def _read(name: str) -> str:
    with open(os.path.join(PROFILE_DIR, name), encoding="utf-8", newline="") as f:
        return f.read()


def _emit(out: str = "", err: str = "", code: int = 0) -> int:
    sys.stdout.write(out)
    sys.stderr.write(err)
    _keep_for_replay(out, err, code)
    return code


def _keep_for_replay(out: str, err: str, code: int) -> None:
    """Leave this answer where standin_nvidia_smi_replay.sh replays it from (it sets the path),
    unless it depends on GPU processes a test has put in place."""
    base = os.environ.get("STANDIN_NVIDIA_SMI_REPLAY")
    if not base or os.path.exists(os.path.join(RUNTIME_DIR, "compute-apps.csv")):
        return
    os.makedirs(os.path.dirname(base), exist_ok=True)
    for suffix, text in ((".out", out), (".err", err), (".rc", f"{code}\n")):  # .rc: the last
        tmp = f"{base}{suffix}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, base + suffix)


def _no_capture(argv: list[str], why: str) -> int:
    return _emit(err=f"standin-nvidia-smi: no capture for {argv!r} in profile "
                     f"{os.path.basename(PROFILE_DIR.rstrip('/'))}: {why}\n", code=NO_CAPTURE_EXIT)


def _answer(entry: dict) -> int:
    return _emit(_read(entry["stdout"]) if entry.get("stdout") else "",
                 _read(entry["stderr"]) if entry.get("stderr") else "",
                 int(entry.get("exit", 0)))


def _options(argv: list[str]) -> dict[str, str] | None:
    """--query-gpu=a,b --format=csv,noheader -> {"--query-gpu": "a,b", "--format": "..."}."""
    opts: dict[str, str] = {}
    it = iter(argv)
    for a in it:
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
        elif a in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id"):
            k, v = a, next(it, "")
        else:
            return None
        opts["--id" if k == "-i" else k] = v
    return opts


def _format_flags(fmt: str) -> tuple[bool, bool] | None:
    parts = [p.strip() for p in fmt.split(",")]
    if not parts or parts[0] != "csv" or any(p not in ("csv", "noheader", "nounits")
                                              for p in parts):
        return None
    return "noheader" in parts, "nounits" in parts


def _query_table(table: list[dict[str, str]], header_of: dict[str, str], fields: list[str],
                 noheader: bool, nounits: bool) -> str:
    lines = []
    if not noheader:
        lines.append(", ".join(header_of[f] for f in fields))
    for row in table:
        values = []
        for f in fields:
            v = row[f]
            if nounits and "[" in header_of[f]:
                unit = header_of[f].split("[", 1)[1].rstrip("]")
                if v.endswith(" " + unit):
                    v = v[: -len(unit) - 1]
            values.append(v)
        lines.append(", ".join(values))
    return "".join(line + "\n" for line in lines)


def _query_gpu(spec: dict, opts: dict[str, str], argv: list[str]) -> int:
    import csv  # only here: a replayed capture needs neither, and each import is CPU per call
    import io

    text = _read(spec["table"])
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    header = rows[0]
    names = [h.split(" [", 1)[0] for h in header]
    header_of = dict(zip(names, header, strict=True))
    table = [dict(zip(names, r, strict=True)) for r in rows[1:] if r]
    fields = [f.strip() for f in opts["--query-gpu"].split(",") if f.strip()]
    aliases = spec.get("aliases", {})
    fields = [aliases.get(f, f) for f in fields]
    missing = [f for f in fields if f not in header_of]
    if missing:
        return _no_capture(argv, f"field(s) {missing} not in {spec['table']}")
    if "--id" in opts:
        wanted = opts["--id"].split(",")
        table = [r for r in table if r.get("index") in wanted]
    flags = _format_flags(opts.get("--format", ""))
    if flags is None:
        return _no_capture(argv, "only --format=csv[,noheader][,nounits] is answered")
    return _emit(_query_table(table, header_of, fields, *flags))


def _query_compute_apps(opts: dict[str, str], argv: list[str]) -> int:
    fields = [f.strip() for f in opts["--query-compute-apps"].split(",") if f.strip()]
    bad = [f for f in fields if f not in COMPUTE_APP_FIELDS]
    if bad:
        return _emit(f'Field "{bad[0]}" is not a valid field to query.\n\n', code=2)
    flags = _format_flags(opts.get("--format", ""))
    if flags is None:
        return _no_capture(argv, "only --format=csv[,noheader][,nounits] is answered")
    noheader, nounits = flags
    rows: list[dict[str, str]] = []
    path = os.path.join(RUNTIME_DIR, "compute-apps.csv")
    if os.path.exists(path):
        import csv

        with open(path, encoding="utf-8") as f:
            for r in csv.reader(f, skipinitialspace=True):
                if r and not r[0].startswith("#"):
                    gpu, pid, mem, pname = (r + ["", "", "", ""])[:4]
                    rows.append({"pid": pid, "used_memory": f"{mem} MiB", "process_name": pname,
                                 "gpu_index": gpu})
    header_of = {f: COMPUTE_APP_FIELDS[f] for f in fields}
    table = []
    for r in rows:
        table.append({f: {"pid": r["pid"], "process_name": r["process_name"],
                          "name": r["process_name"], "used_memory": r["used_memory"],
                          "used_gpu_memory": r["used_memory"]}.get(f, "N/A") for f in fields})
    return _emit(_query_table(table, header_of, fields, noheader, nounits))


def main(argv: list[str]) -> int:
    try:
        spec = json.loads(_read("commands.json"))
    except OSError as e:
        return _emit(err=f"standin-nvidia-smi: no profile at {PROFILE_DIR}: {e}\n", code=96)
    if spec.get("any"):  # an error profile: every invocation gets the same real answer
        return _answer(spec["any"])
    for entry in spec.get("commands", []):
        if entry["argv"] == argv:
            return _answer(entry)
    for entry in spec.get("commands", []):  # option order does not matter to nvidia-smi
        if sorted(entry["argv"]) == sorted(argv):
            return _answer(entry)
    opts = _options(argv)
    if opts and "--query-gpu" in opts and spec.get("query_gpu"):
        return _query_gpu(spec["query_gpu"], opts, argv)
    if opts and "--query-compute-apps" in opts and spec.get("query_compute_apps", True):
        return _query_compute_apps(opts, argv)
    return _no_capture(argv, "not in commands.json")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
