#!/usr/bin/env python3
"""The real-GPU run (issue 39), on the borrowed H200 machine; ``run_on_gpu.sh`` sets it up and
calls it. Everything it learns goes to ``$RG_WORK/record.json`` (and each server's log to
``$RG_WORK/logs/``; run_on_gpu.sh packs that folder into $OUT) as it goes, so a run cut
short still reports what it did.

For each run: the machine's live facts through specfleet's own facts (``pyinfra @local fact``:
``facts.gpu.Gpus``, ``facts.gpu.GpuTopology``, ``facts.sglang.SGLangInstall`` of the run's venv),
the plan from them (``python -m specfleet.plan`` with the run's settings file from
``bench/real_gpu/settings/``), the unit and environment file rendered by ``operations.serving``
as a deploy renders them, the server started from that unit (by systemd where it runs; else the
unit's own ExecStart and EnvironmentFile, with a stand-in ``systemctl`` for the gate, named as one),
the readiness gate, then greedy ``/generate`` on fixed prompt token ids.

The model paths of the plan (``/srv/models/<repo>/current``) are links to the tiny configs in
``bench/real_gpu/models/`` (``--load-format dummy``: no weights), so the plan's argv runs as is.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "bench" / "real_gpu"
sys.path.insert(0, str(ROOT))
OUT = Path(os.environ.get("RG_WORK", "/tmp/real_gpu"))
T0 = time.monotonic()
BUDGET_S = float(os.environ.get("REAL_GPU_BUDGET_S", "540"))
RECORD: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": {}}
if (OUT / "record.json").is_file():  # a second call on the same machine goes on from the first
    RECORD = json.loads((OUT / "record.json").read_text())
    RECORD.setdefault("resumed", []).append(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
STANDIN_DIR = Path("/run/specfleet-standin")
TINY_DRAFTER = HERE / "models" / "tiny-drafter" / "config.json"
TINY_WEIGHTS_BYTES = 400 * 1024**2  # bf16 parameters of both tiny models, rounded up
PROMPTS = json.loads((HERE / "prompts.json").read_text())


def elapsed() -> float:
    return time.monotonic() - T0


def save() -> None:
    RECORD["elapsed_s"] = round(elapsed(), 1)
    (OUT / "record.json").write_text(json.dumps(RECORD, indent=1))


def log(text: str) -> None:
    print(f"[{elapsed():6.1f}s] {text}", flush=True)


def run(cmd: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def systemd_runs() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


# --------------------------------------------------------------------------------------------------
# Facts and plan, through the project's own code
# --------------------------------------------------------------------------------------------------


def live_facts(python: str) -> tuple[dict, str]:
    """{fact name: value} for this machine, and the raw pyinfra output."""
    cmd = [sys.executable, "-m", "pyinfra", "@local", "fact", "facts.gpu.Gpus",
           "facts.gpu.GpuTopology", "facts.sglang.SGLangInstall", f"python={python}", "--json"]
    res = run(cmd, cwd=ROOT)
    facts: dict = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            for name, per_host in json.loads(line).items():
                facts[name.split(" (")[0]] = per_host.get("@local")
    return facts, f"$ {shlex.join(cmd)}\n{res.stdout}{res.stderr}"


def make_plan(settings_file: Path, venv: str, facts: dict, tag: str,
              drafter_config: Path = TINY_DRAFTER, weights_bytes: int = TINY_WEIGHTS_BYTES) -> dict:
    data = json.loads(settings_file.read_text())
    data["venv"] = venv
    data["service_name"] = f"specfleet-{tag}"
    work = OUT / "plans"
    work.mkdir(exist_ok=True)
    (work / f"{tag}-settings.json").write_text(json.dumps(data, indent=1))
    (work / f"{tag}-facts.json").write_text(json.dumps(facts, indent=1))
    cmd = [sys.executable, "-m", "specfleet.plan", "--facts", str(work / f"{tag}-facts.json"),
           "--settings", str(work / f"{tag}-settings.json"), "--drafter-config",
           str(drafter_config), "--weights-bytes", str(weights_bytes), "--json"]
    res = run(cmd, cwd=ROOT)
    plan = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {"error": res.stderr}
    plan["command"] = shlex.join(cmd)
    plan["settings"] = data
    return plan


def render_unit(plan: dict) -> dict:
    """The unit, env file and logging files exactly as the deploy renders them."""
    from operations import serving
    from specfleet.core.settings import settings_from_dict

    settings = settings_from_dict(plan["settings"])
    install = plan.get("install") or {}
    build = serving.build_info(settings, install)
    ctx = serving.unit_context(plan["argv"], plan["env"], settings, build)
    paths = serving.server_paths(settings)
    files = {
        paths.unit: serving.render(serving.UNIT_TEMPLATE, ctx),
        paths.env: serving.render(serving.ENV_TEMPLATE, ctx),
        paths.log_config: serving.logging_config(settings, plan["argv"]),
        paths.log_module: serving.LOG_MODULE.read_text(),
    }
    for path, text in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    Path(settings.models_root, ".cache").mkdir(parents=True, exist_ok=True)
    return {"unit_name": paths.unit_name, "unit_path": paths.unit, "env_path": paths.env,
            "unit": files[paths.unit], "env": files[paths.env]}


# --------------------------------------------------------------------------------------------------
# Starting the unit
# --------------------------------------------------------------------------------------------------


def unit_exec(unit_text: str) -> tuple[list[str], str]:
    """ExecStart's words and WorkingDirectory, read back from the rendered unit."""
    lines, cont, workdir = [], False, "/"
    for raw in unit_text.splitlines():
        if raw.startswith("ExecStart=") or cont:
            part = raw[len("ExecStart="):] if raw.startswith("ExecStart=") else raw
            cont = part.rstrip().endswith("\\")
            lines.append(part.rstrip().rstrip("\\"))
        elif raw.startswith("WorkingDirectory="):
            workdir = raw.split("=", 1)[1]
    words = shlex.split(" ".join(lines))
    return [w.replace("$$", "$").replace("%%", "%") for w in words], workdir


def env_file(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            env[key] = shlex.split(value)[0] if value else ""
    return env


STANDIN_SYSTEMCTL = """#!/bin/sh
# STAND-IN for systemctl (no systemd on this machine): answers the readiness gate's
# `systemctl show UNIT -p...` from the pid file bench/real_gpu/drive.py wrote when it started the
# unit's ExecStart. Anything else is refused.
[ "$1" = show ] || { echo "stand-in systemctl: only 'show'" >&2; exit 1; }
pid=$(cat "$(dirname "$0")/../$2.pid" 2>/dev/null || echo 0)
state=failed; sub=failed
# a process that exited is a zombie until drive.py reaps it: state Z counts as gone
if [ "$pid" != 0 ] && [ -r /proc/$pid/stat ] && [ "$(cut -d' ' -f3 /proc/$pid/stat)" != Z ]; then
  state=active; sub=running
fi
echo LoadState=loaded; echo ActiveState=$state; echo SubState=$sub; echo Result=success
echo NRestarts=0; echo MainPID=$pid; echo ExecMainStatus=0
"""


class Server:
    def __init__(self, rendered: dict, tag: str):
        self.r, self.tag, self.proc = rendered, tag, None
        self.log_path = OUT / "logs" / f"{tag}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self.how = ""

    def start(self) -> None:
        unit = self.r["unit_name"]
        if systemd_runs():
            run(["systemctl", "daemon-reload"])
            res = run(["systemctl", "start", unit])
            self.how = f"systemd: systemctl start {unit} (rc {res.returncode} {res.stderr.strip()})"
            return
        argv, workdir = unit_exec(self.r["unit"])
        env = {**os.environ, **env_file(self.r["env"])}
        env.pop("PYTHONPATH", None)
        env.update(env_file(self.r["env"]))
        self.logf = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, env=env, cwd=workdir, stdout=self.logf,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        STANDIN_DIR.mkdir(parents=True, exist_ok=True)
        (STANDIN_DIR / f"{unit}.pid").write_text(str(self.proc.pid))
        cg = Path(os.environ.get("RG_CGROUP_ROOT", "/sys/fs/cgroup")) / unit
        cg_note = "no cgroup"
        try:
            cg.mkdir(exist_ok=True)
            (cg / "cgroup.procs").write_text(str(self.proc.pid))
            cg_note = f"cgroup {cg}"
        except OSError as exc:
            cg_note = f"no cgroup ({exc})"
        self.how = (f"no systemd here (PID 1 is {Path('/proc/1/comm').read_text().strip()}): "
                    f"the unit's ExecStart run directly with its EnvironmentFile, in {cg_note}; "
                    "the gate reads a stand-in systemctl")

    def journal(self) -> str:
        if systemd_runs():
            return run(["journalctl", "-u", self.r["unit_name"], "--no-pager", "-o", "cat"]).stdout
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if systemd_runs():
            run(["systemctl", "stop", self.r["unit_name"]], timeout=90)
            self.log_path.write_text(self.journal())
        elif self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.logf.close()
        # The GPU memory comes back once every process of the server is gone. Only the server's
        # own (its process group) count: the ServerArgs check (C) may hold the GPU meanwhile.
        group = self.proc.pid if self.proc is not None else None
        for _ in range(60):
            res = run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
            pids = [int(x) for x in res.stdout.split() if x.strip().isdigit()]
            if group is None:
                if not pids:
                    break
            elif not any(_pgid(pid) == group for pid in pids):
                break
            time.sleep(1)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def main_pid_cmdline(unit: str) -> dict:
    """What the readiness gate reads as the server's argv: /proc/MainPID/cmdline, raw (the
    probe's "no speculative decoding" finding of run 3), with the process's name."""
    try:
        pid = (STANDIN_DIR / f"{unit}.pid").read_text().strip()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        name = Path(f"/proc/{pid}/status").read_text().splitlines()[0]
    except OSError as exc:
        return {"error": repr(exc)}
    words = raw.split(b"\0")
    return {"pid": pid, "status_name": name, "bytes": len(raw), "nul_count": raw.count(b"\0"),
            "words": len(words) - 1, "head": raw[:700].decode(errors="replace"),
            "has_speculative_flag": b"--speculative-algorithm\0" in raw}


def gate(unit: str, timeout: float, gate_file: Path, probe: dict | None = None) -> dict:
    cmd = [sys.executable, str(gate_file), "--unit", unit, "--timeout", str(int(timeout)),
           "--poll", "2", "--report-every", "20"]
    if probe is not None:
        cmd += ["--probe", json.dumps(probe)]
    env = dict(os.environ)
    if not systemd_runs():
        env["PATH"] = f"{STANDIN_DIR}/bin:{env['PATH']}"
    try:
        res = run(cmd, timeout=timeout + 120, env=env)
        return {"command": shlex.join(cmd), "rc": res.returncode, "output": res.stdout + res.stderr}
    except subprocess.TimeoutExpired as exc:
        return {"command": shlex.join(cmd), "rc": "timeout", "output": str(exc.stdout)}


def post(path: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:30000{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return {"error": f"HTTP {exc.code}: {exc.read(2000).decode(errors='replace')}"}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"error": repr(exc)}


def wait_healthy(timeout: float, server: Server | None = None) -> bool:
    """Our own poll of /health_generate, so the comparison runs even where the gate refused for a
    reason of this machine's (recorded beside it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server is not None and server.proc is not None and server.proc.poll() is not None:
            return False  # the server exited
        try:
            with urllib.request.urlopen("http://127.0.0.1:30000/health_generate", timeout=30) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    return False


def generate() -> dict:
    """Greedy, 48 tokens, ignore_eos, each prompt alone (batch 1), then all three at once."""
    sp = {"temperature": 0, "max_new_tokens": PROMPTS["max_new_tokens"], "ignore_eos": True}
    out: dict = {"single": [], "batch": []}
    for ids in PROMPTS["prompts"]:
        res = post("/generate", {"input_ids": ids, "sampling_params": sp})
        out["single"].append({"output_ids": res.get("output_ids"),
                              "meta_info": res.get("meta_info"), "error": res.get("error")})
    res = post("/generate", {"input_ids": PROMPTS["prompts"], "sampling_params": sp})
    if isinstance(res, list):
        out["batch"] = [{"output_ids": r.get("output_ids"), "meta_info": r.get("meta_info")}
                        for r in res]
    else:
        out["batch_error"] = res.get("error") or str(res)[:500]
    metas = [s["meta_info"] or {} for s in out["single"]]
    verify = sum(m.get("spec_verify_ct", 0) or 0 for m in metas)
    tokens = sum(m.get("completion_tokens", 0) or 0 for m in metas)
    if verify:
        out["acceptance_length"] = round(tokens / verify, 3)
    return out


def changed_lines(log_text: str) -> list[str]:
    keys = ("change", "adjust", "set ", "override", "disable", "reset", "Overlap", "overlap",
            "max_running_requests", "mem_fraction", "cuda graph", "accept", "WARNING", "Error",
            "error", "server_args=")
    return [ln for ln in log_text.splitlines() if any(k in ln for k in keys)][:200]


def one_run(tag: str, settings: str, venv: str, gate_files: list[tuple[str, Path, dict | None]],
            ready_s: float) -> dict | None:
    done = RECORD["runs"].get(tag) or {}
    if done.get("generate"):
        log(f"run {tag}: done in an earlier call")
        return done
    ready_s = min(ready_s, BUDGET_S - elapsed() - 30)
    if ready_s < 90:
        RECORD["runs"][tag] = {"skipped": f"out of time at {elapsed():.0f} s"}
        save()
        return None
    log(f"run {tag}: facts, plan, unit")
    entry: dict = {"settings_file": f"bench/real_gpu/settings/{settings}.json", "venv": venv}
    RECORD["runs"][tag] = entry
    facts, raw = live_facts(f"{venv}/bin/python")
    entry["facts"] = facts
    (OUT / "plans" / f"{tag}-facts-raw.txt").write_text(raw)
    plan = make_plan(HERE / "settings" / f"{settings}.json", venv, facts, tag)
    plan["install"] = facts.get("facts.sglang.SGLangInstall")
    entry["plan"] = {k: plan.get(k) for k in ("argv", "env", "reasons", "error", "command")}
    save()
    if "argv" not in plan:
        log(f"run {tag}: no plan: {plan.get('error')}")
        return None
    rendered = render_unit(plan)
    entry["unit"], entry["env_file"] = rendered["unit"], rendered["env"]
    if os.environ.get("RG_DRY"):  # a rehearsal where no GPU is: facts, plan and unit only
        entry["dry"] = True
        save()
        return entry
    server = Server(rendered, tag)
    server.start()
    entry["started_how"] = server.how
    log(f"run {tag}: {server.how}")
    t = time.monotonic()
    entry["gates"] = {}
    for name, gate_file, probe in gate_files:
        entry["gates"][name] = gate(rendered["unit_name"], ready_s, gate_file, probe)
        log(f"run {tag}: gate {name} rc {entry['gates'][name]['rc']}")
        entry.setdefault("main_pid_cmdline", []).append(
            {"after_gate": name, **main_pid_cmdline(rendered["unit_name"])})
        save()
    healthy = wait_healthy(max(5.0, ready_s - (time.monotonic() - t)), server)
    entry["ready_s"] = round(time.monotonic() - t, 1)
    entry["healthy"] = healthy
    if healthy:
        entry["generate"] = generate()
        log(f"run {tag}: generated; acceptance {entry['generate'].get('acceptance_length')}")
    server.stop()
    text = server.journal() if systemd_runs() else server.log_path.read_text(errors="replace")
    entry["log_lines_about_changes"] = changed_lines(text)
    entry["log_tail"] = text[-4000:]
    save()
    return entry


def compare(a: str, b: str) -> dict:
    ra, rb = RECORD["runs"].get(a, {}), RECORD["runs"].get(b, {})
    ga, gb = ra.get("generate"), rb.get("generate")
    if not ga or not gb:
        return {"runs": [a, b], "result": "not compared: a run has no outputs"}
    rows = []
    for kind in ("single", "batch"):
        for i, (x, y) in enumerate(zip(ga.get(kind) or [], gb.get(kind) or [], strict=False)):
            xo, yo = x.get("output_ids") or [], y.get("output_ids") or []
            first = next((j for j, (p, q) in enumerate(zip(xo, yo, strict=False)) if p != q), None)
            if first is None and len(xo) != len(yo):
                first = min(len(xo), len(yo))
            rows.append({"kind": kind, "prompt": i, "tokens": [len(xo), len(yo)],
                         "identical": bool(xo) and xo == yo, "first_difference": first})
    same = all(r["identical"] for r in rows) and bool(rows)
    return {"runs": [a, b], "result": "identical" if same else "DIFFERENT", "rows": rows}


def main() -> int:
    (OUT / "plans").mkdir(parents=True, exist_ok=True)
    (STANDIN_DIR / "bin").mkdir(parents=True, exist_ok=True)
    sc = STANDIN_DIR / "bin" / "systemctl"
    sc.write_text(STANDIN_SYSTEMCTL)
    sc.chmod(0o755)
    RECORD["systemd"] = systemd_runs()
    RECORD["pid1"] = Path("/proc/1/comm").read_text().strip()
    RECORD["commit"] = os.environ.get("RG_COMMIT", "?")
    main_gate = ROOT / "specfleet" / "hostside" / "readiness_gate.py"
    probe = json.loads((HERE / "probe.json").read_text())
    health = [("health (the repository's gate)", main_gate, None)]
    gates = health + [("answer probe (the repository's gate, --probe)", main_gate, probe)]
    save()
    stock = os.environ["VENV_STOCK"]
    trees = {k: os.environ[f"VENV_{k.upper().replace('-', '_')}"]
             for k in ("unfixed", "stale-mask", "fixed")}
    RECORD.setdefault("comparisons", {})
    only = set(filter(None, os.environ.get("RG_ONLY", "A,B").split(",")))
    if "A" in only:
        one_run("A-dflash-fa3", "a-dflash", stock, gates, 200)
        one_run("A-plain-fa3", "a-plain", stock, health, 160)
        RECORD["comparisons"]["A"] = compare("A-plain-fa3", "A-dflash-fa3")
        save()
        log(f"comparison A: {RECORD['comparisons']['A']['result']}")
    if "B" in only:
        # The plain (non-speculative) server on the port as main ships it: the reference.
        one_run("B-plain-triton", "b-plain", trees["fixed"], health, 160)
        for kind in ("unfixed", "stale-mask", "fixed"):
            tag = f"B-{kind}-dflash-triton"
            one_run(tag, "b-dflash", trees[kind], gates if kind == "unfixed" else health, 200)
            RECORD["comparisons"][f"B-{kind}"] = compare("B-plain-triton", tag)
            save()
    log("comparisons: " + json.dumps({k: v["result"] for k, v in RECORD["comparisons"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
