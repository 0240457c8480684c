"""deploys/kimi_k26.py and deploys/status.py through the real pyinfra CLI, on one fleet of real hosts.

The fleet (tests.fleet, booted once for this module) has four hosts that converge, of different
machine types: a CT200-like 8x RTX PRO 6000 with an existing venv and a host token and 593 GiB
free, an 8x B200, an 8x H100 and a 2x H200. The other hosts exist to fail preflight, each in one
way, for real: no GPU, a broken nvidia-smi, busy GPUs, an old driver, a tiny models disk, and
plain 2x H200 hosts whose settings or state are wrong (TP 16, an unknown attention backend, the
real Kimi target on 2 GPUs, a foreign server on the port, an SGLang with no wheel, an SGLang
without DFLASH, a gated drafter and no token).

What stands in (see tests/demo.py): nvidia-smi replays real captures, the hub serves small
Kimi-shaped repos, the SGLang server is tests/harness/standin_sglang_server.py. Runs are few and use
--limit: the machine is small and shared.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specfleet.core.layout import serve_path
from specfleet.core.settings import settings_from_dict
from tests.demo import (
    DEMO_TOKEN,
    DRAFTER,
    PYINFRA,
    REPO_ROOT,
    TARGET,
    Demo,
    host_venv,
    serve,
    standin_record,
)
from tests.harness import HostSpec
from tests.harness.sources import PR20547_TARBALL, RECORD_CHECK
from tests.harness.weights_support import commit_files, random_bytes
from tests.unit.test_standin_refusal import assert_accepted

pytestmark = pytest.mark.timeout(1800)

CONVERGE = ["ct200", "b200", "h100", "h200"]
UNIT = "specfleet-sglang.service"
LOCK = "/var/lib/specfleet/run.lock"
STATE_FILES = f"/etc/systemd/system/{UNIT} /etc/specfleet/specfleet-sglang.env"

SPECS = [
    HostSpec("ct200", gpu="rtx6000x8", disk="593G"),
    HostSpec("b200", gpu="b200x8", disk="64G"),
    HostSpec("h100", gpu="h100x8", disk="64G"),
    HostSpec("h200", gpu="h200x2", disk="64G"),
    # Preflight failures from the machine itself.
    HostSpec("nogpu", gpu="nogpu", disk="64G"),
    HostSpec("mismatch", gpu="driver-mismatch", disk="64G"),
    HostSpec("busy", gpu="h200x2-busy", disk="64G"),
    HostSpec("olddrv", gpu="old-driver", disk="64G"),
    HostSpec("tinydisk", gpu="h200x2", disk="4M"),
    # Preflight failures from settings or state (each a plain 2x H200).
    HostSpec("tp16", gpu="h200x2", disk="64G"),
    HostSpec("backend", gpu="h200x2", disk="64G"),
    HostSpec("memory", gpu="h200x2", disk="64G"),
    HostSpec("port", gpu="h200x2", disk="64G"),
    HostSpec("nowheel", gpu="h200x2", disk="64G"),
    HostSpec("nodflash", gpu="h200x2", disk="64G"),
    HostSpec("notoken", gpu="h200x2", disk="64G"),
]

# Per host: the settings that make it fail, and what its preflight must say (every string).
PREFLIGHT = {
    "nogpu": ({}, ["preflight plan: no GPUs: no nvidia-smi on the host, or it lists none",
                   "fix: run on a host with NVIDIA GPUs and a working driver"]),
    "mismatch": ({}, ["preflight plan: no GPUs: nvidia-smi failed: Failed to initialize NVML: "
                      "Driver/library version mismatch", "NVML library version: 570.124",
                      "(exit status 18)"]),
    "busy": ({}, ["preflight gpus-busy: the GPUs are already in use by processes outside "
                  "specfleet-sglang: pid 719 (10758 MiB)", "fix: stop those processes"]),
    "olddrv": ({}, ["preflight plan: GPU compute capability unknown",
                    'nvidia-smi said: Field "compute_cap" is not a valid field to query.',
                    "fix: update the NVIDIA driver"]),
    "tinydisk": ({"weights": {"margin_min_gib": 0.0}},
                 ["preflight disk: not enough disk space at /srv/models: 6.0 MiB still to "
                  "download + 0.1 MiB margin = 6.1 MiB needed, 4.0 MiB free (short by ",
                  "on the filesystem of /srv/models"]),
    "tp16": ({"plan": {"tp_size": 16}},
             ["preflight plan: --tp-size 16 needs 16 GPUs, the host has 2",
              "fix: set plan.tp_size to at most 2"]),
    "backend": ({"plan": {"attention_backend": "no_such_backend"}},
                ["preflight plan: plan.attention_backend 'no_such_backend' is not in SGLang "
                 "0.5.11's attention registry"]),
    "memory": ({"target": {"repo_id": "moonshotai/Kimi-K2.6"}},
               ["preflight plan: 2 GPUs hold 281 GiB in all, far below the 561 GiB of weights "
                "(moonshotai/Kimi-K2.6 + demo/Kimi-K2.6-DFlash-mini)",
                "fix: use a host with more GPU memory"]),
    "port": ({}, ["preflight port-taken: port 30000 is already taken by a process that is not "
                  "specfleet-sglang: python3 (pid ", "fix: stop that process, or give this host "
                  "another port"]),
    # 0.5.24: past the newest release the test wheelhouse holds (0.5.23, whose row plans it).
    "nowheel": ({"sglang": {"version": "0.5.24"}},
                ["preflight sglang-wheel: no SGLang 0.5.24 wheel for this host's interpreter",
                 "No matching distribution found for sglang==0.5.24",
                 "fix: use an SGLang version with a wheel for this Python and glibc"]),
    "nodflash": ({"sglang": {"version": "0.5.10"}},
                 ["preflight plan: SGLang 0.5.10 has no DFLASH speculative decoding",
                  "fix: install sglang >= 0.5.11",
                  "No matching distribution found for sglang==0.5.10"]),
}


# --------------------------------------------------------------------------------------------------
# The fleet and the CLI
# --------------------------------------------------------------------------------------------------


class Env:
    """The booted demo, plus the per-host settings overrides the deploy currently runs with."""

    def __init__(self, demo: Demo):
        self.demo = demo
        self.fleet = demo.fleet
        self.over: dict[str, dict] = {h: dict(PREFLIGHT.get(h, ({},))[0]) for h in demo.fleet.hosts}

    def inventory(self, name: str = "inventory.py", **extra) -> Path:
        over = {h: {**self.over.get(h, {}), **extra.get(h, {})} for h in self.fleet.hosts}
        return self.demo.write_inventory(self.demo.workdir / name, **over)

    def pyinfra(self, *args: str, deploy: str = "deploys/kimi_k26.py", inventory: Path | None = None,
                token: bool = True, timeout: float = 900) -> tuple[int, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        if token:
            env["HF_TOKEN"] = DEMO_TOKEN
        argv = [PYINFRA, *args, str(inventory or self.inventory()), deploy]
        start = time.monotonic()
        res = subprocess.run(argv, cwd=REPO_ROOT, env=env, timeout=timeout, capture_output=True,
                             text=True)
        out = res.stdout + res.stderr
        TIMINGS.append((" ".join(a for a in args if a != "-y") or "-y", deploy,
                        round(time.monotonic() - start, 1)))
        return res.returncode, out

    def run(self, host: str, cmd: str, check: bool = True) -> str:
        return self.fleet.run(host, cmd, check=check).stdout

    def starts(self, host: str) -> int:
        """How many times systemd started the SGLang unit on this host (its journal)."""
        out = self.run(host, f"journalctl -u {UNIT} -o cat --no-pager | grep -c '^Started ' "
                             "|| true")
        return int(out.strip() or 0)

    def snapshot(self, host: str) -> str:
        """What a deploy could change on a host: unit files, venv, weights, lock, server pid."""
        return self.run(host, (
            f"for f in {STATE_FILES} {LOCK}; do test -e $f && sha1sum $f || echo absent $f; done; "
            "ls -la --time-style=+%s /srv/models /opt/specfleet 2>&1; "
            f"systemctl show -p MainPID -p ActiveState -p InvocationID {UNIT}"))


TIMINGS: list[tuple[str, str, float]] = []


def limit(*hosts: str) -> list[str]:
    return [a for h in hosts for a in ("--limit", h)]


_RESULT = re.compile(r"^\s+\[([^\]]+)\]\s+(Success|No changes|Error\b.*)$")


def op_results(out: str) -> dict[str, dict[str, str]]:
    """{host: {operation: "Success" | "No changes" | "Error..."}} from pyinfra's run output."""
    results: dict[str, dict[str, str]] = {}
    op = None
    for line in out.splitlines():
        if line.startswith("--> Starting operation: "):
            # Operations of a @deploy are named "<deploy> | <operation>".
            op = line[len("--> Starting operation: "):].strip().split(" | ")[-1]
        elif line.startswith("--> "):
            op = None
        elif op and (m := _RESULT.match(line)):
            results.setdefault(m.group(1), {})[op] = m.group(2)
    return results


def changed(out: str) -> dict[str, list[str]]:
    """{host: [operations that reported a change]}."""
    return {h: [op for op, r in ops.items() if r == "Success"] for h, ops in op_results(out).items()}


def results_table(out: str) -> dict[str, list[str]]:
    """pyinfra's closing Results table: {operation: [hosts, success, error, no change]}."""
    rows = {}
    section = out.split("--> Results:", 1)[-1].split("--> ", 1)[0]
    for line in section.splitlines()[2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 5:
            rows[cells[0]] = cells[1:]
    return rows


def host_output(out: str, host: str) -> str:
    """Everything pyinfra printed for one host, continuation lines included."""
    lines, mine = [], False
    for line in out.splitlines():
        m = re.match(r"^\s*\[([^\]]+)\]\s", line)
        if m:
            mine = m.group(1) == host
        elif line.startswith("-->"):
            mine = False
        if mine:
            lines.append(line)
    return "\n".join(lines)


def model_info(env: Env, host: str, port: int = 30000) -> dict:
    return json.loads(env.run(host, f"curl -s --max-time 10 http://127.0.0.1:{port}/get_model_info"))


def standin_argv(env: Env, host: str) -> list[str]:
    return standin_record(env.fleet, host)["argv"]


def assert_sglang_accepted(env: Env, host: str) -> None:
    """The host's server started, and SGLang's rules on its venv's tree ran on the flags."""
    assert_accepted(standin_record(env.fleet, host)["sglang_rules"], host_venv(host))


@pytest.fixture(scope="module")
def env(make_fleet, tmp_path_factory):
    """tests/demo.py's `serve()`, on a fleet from `make_fleet` (reaped if this process dies)."""
    demo = serve(make_fleet("deploy", SPECS), tmp_path_factory.mktemp("deploy"))
    try:
        # A server started by hand on the port (CT200 may have one): not our unit.
        demo.fleet.run("port", "systemd-run --unit=hand-started-server python3 -m http.server "
                               "30000 --bind 127.0.0.1", check=True)
        yield Env(demo)
    finally:
        demo.hub.stop()
        print("\npyinfra runs (args, deploy, seconds):", *TIMINGS, sep="\n  ")


# --------------------------------------------------------------------------------------------------
# --dry on a fresh fleet: first, before anything is deployed
# --------------------------------------------------------------------------------------------------

# Everything a deploy (or its probe) could write: specfleet's files, units, venvs, models, packages.
HOST_STATE = (
    "find /etc/systemd/system /etc/specfleet /opt /srv/models /var/lib/specfleet /root "
    # The health watchdog rewrites its own state file every tick: that is no change by a run.
    "/run/systemd/transient /usr/local -xdev -path /root/.cache/pip -prune -o "
    "-name '*.watchdog-state.json' -prune -o -type d -printf '%p %m\\n' "
    "-o -printf '%p %s %T@ %m %y %l\\n' 2>/dev/null | sort; "
    "dpkg-query -W -f '${Package} ${Version} ${Status}\\n'; "
    "for py in /root/venv_sglang211/bin/python /opt/specfleet/sglang/bin/python; do "
    "test -x $py && $py -m pip list --format=freeze --disable-pip-version-check; done; "
    "systemctl list-units --all --plain --no-legend --no-pager 'specfleet*' | grep -v not-found; "
    "true"
)


def host_state(env: Env, host: str) -> str:
    """A digest of ``HOST_STATE`` (the listing itself when it differs is too long to read).
    A folder's mtime is left out: the run lock, taken and released, is no change."""
    out = env.run(host, HOST_STATE)
    return hashlib.sha256(out.encode()).hexdigest() + f" ({len(out.splitlines())} lines)"


def test_dry_run_on_a_fresh_fleet_changes_nothing(env):
    before = {h: host_state(env, h) for h in CONVERGE}
    rc, out = env.pyinfra("--dry", *limit(*CONVERGE))
    assert rc == 0, out[-4000:]
    # It planned the whole deploy on every host (the detected changes name its last steps)...
    assert "SGLang server running, enabled and ready" in out.split("--> Detected changes:")[-1]
    assert "Error" not in out and "--> Beginning operation run" not in out
    # ...and changed nothing anywhere.
    assert {h: host_state(env, h) for h in CONVERGE} == before


# --------------------------------------------------------------------------------------------------
# Converge, idempotence, restart on change
# --------------------------------------------------------------------------------------------------


def test_first_run_converges_every_host(env):
    before = {h: env.starts(h) for h in CONVERGE}
    rc, out = env.pyinfra("-y", *limit(*CONVERGE))
    assert rc == 0, out[-4000:]
    results = op_results(out)
    assert sorted(results) == sorted(CONVERGE)
    for host in CONVERGE:
        assert all(r in ("Success", "No changes") for r in results[host].values()), results[host]
        assert results[host]["SGLang server running, enabled and ready"] == "Success"
        assert results[host]["Preflight"] == "No changes"
        settings = settings_from_dict(env.demo.settings(host), host=host)
        assert model_info(env, host)["model_path"] == serve_path(settings, "target")
        assert_sglang_accepted(env, host)
        assert env.starts(host) == before[host] + 1
        assert env.run(host, f"test -e {LOCK} && echo held || echo free").strip() == "free"
    # CT200's existing venv is reused in place, not replaced by a new one.
    assert "0.5.11" in env.run("ct200", "/root/venv_sglang211/bin/pip show sglang")
    assert env.run("ct200", "test -e /opt/specfleet/sglang && echo yes || echo no").strip() == "no"


def test_second_run_changes_nothing(env):
    before = {h: env.starts(h) for h in CONVERGE}
    rc, out = env.pyinfra("-y", *limit(*CONVERGE))
    assert rc == 0, out[-4000:]
    assert changed(out) == {h: [] for h in CONVERGE}
    table = results_table(out)
    assert table and all(success == "-" and no_change == hosts
                         for hosts, success, _, no_change in table.values()), table
    assert table["Grand total"][3] == str((len(table) - 1) * len(CONVERGE))
    assert {h: env.starts(h) for h in CONVERGE} == before


def test_a_converged_host_needs_no_token_exported(env):
    """The hosts hold the copy of the token the first run put there: a converged run from a
    control machine without HF_TOKEN passes preflight and changes nothing."""
    hosts = ["b200", "h100"]
    rc, out = env.pyinfra("-y", *limit(*hosts), token=False)
    assert rc == 0, out[-4000:]
    assert changed(out) == {h: [] for h in hosts}


def test_a_converged_run_is_two_commands_per_host(env):
    """The run lock's take carries the probe of every fact (operations/probe.py): the operations
    of a converged run are that command and the lock's release, per host, as bench/converged
    counts them (a remote process each: ``Running command on`` and ``Attempting upload`` in
    pyinfra's debug log), over the whole run: loading the deploy file (operations.venvs picks the
    venv from the probe too) asks nothing live. No renewal runs within the lease, and nothing is
    left to release at exit."""
    hosts = ["ct200", "h200"]
    rc, out = env.pyinfra("-y", "--debug", *limit(*hosts))
    assert rc == 0, out[-4000:]
    assert changed(out) == {h: [] for h in hosts}
    run = out
    counts = {h: len(re.findall(rf"Running command on {h}:", run)) for h in hosts}
    uploads = len(re.findall(r"Attempting upload of ", run))
    said = [ln[:240] for ln in run.splitlines()
            if "Running command on" in ln or "fact cache miss" in ln]
    assert counts == {h: 2 for h in hosts} and uploads == 0, (counts, uploads, said)


# One controller process running the deploy twice (the rollout's in-process session): every run
# probes the host again, so a change made between the two runs is seen by the second.
SESSION_TWICE = """
import json, subprocess, sys
from specfleet.fleet.pyinfra_run import deploy_path, session
inventory, host, change = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
runs = {}
with session(inventory) as s:
    s.connect([host])
    runs["first"] = s.run(str(deploy_path("kimi_k26.py")), [host], "first")
    subprocess.run(change, check=True)
    runs["second"] = s.run(str(deploy_path("kimi_k26.py")), [host], "second")
print("RESULT " + json.dumps({name: {"status": r.results[host].status,
                                     "changed": r.results[host].changed_ops}
                              for name, r in runs.items()}))
"""


def test_a_change_between_two_runs_of_one_process_is_seen(env):
    """Nothing is answered from an earlier run's facts (the per-process memos of
    bench/converged's CPU work key on what this run read): in one controller process, a
    converged run, then the server stopped behind its back, then a run that starts it again."""
    host = "h100"
    change = [*env.fleet.ssh_argv(host), "--", f"systemctl stop {UNIT}"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environ["HF_TOKEN"] = DEMO_TOKEN
    res = subprocess.run([sys.executable, "-c", SESSION_TWICE, str(env.inventory()), host,
                          json.dumps(change)], cwd=REPO_ROOT, env=environ, capture_output=True,
                         text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["first"] == {"status": "ok", "changed": []}, out[-4000:]
    assert result["second"]["status"] == "changed", out[-4000:]
    assert any("SGLang server running" in op for op in result["second"]["changed"]), result
    assert env.run(host, f"systemctl is-active {UNIT}").strip() == "active"


def test_changed_settings_restart_exactly_once(env):
    """b200 gets a new flag, h100 a new target revision committed to the hub; the other two
    hosts keep theirs. Each changed host restarts once; a rerun changes nothing again."""
    demo = env.demo
    new_rev = commit_files(demo.workdir / "mirrors", TARGET, {
        "model-00002-of-00002.safetensors": random_bytes(2 << 20, "t2-v2")}, message="v2")
    env.over["b200"] = {"plan": {"extra_args": {"--context-length": "4096"}}}
    env.over["h100"] = {"target": {"repo_id": TARGET, "revision": new_rev}}
    before = {h: env.starts(h) for h in CONVERGE}
    rc, out = env.pyinfra("-y", *limit(*CONVERGE))
    assert rc == 0, out[-4000:]
    after = {h: env.starts(h) for h in CONVERGE}
    assert {h: after[h] - before[h] for h in CONVERGE} == {"ct200": 0, "b200": 1, "h100": 1,
                                                           "h200": 0}
    moved = changed(out)
    assert moved["ct200"] == [] and moved["h200"] == []
    assert "SGLang unit from the launch plan" in moved["b200"]
    assert {"Target weights demo/Kimi-K2.6-mini", "SGLang unit from the launch plan"} <= set(
        moved["h100"])
    argv = standin_argv(env, "b200")
    assert argv[argv.index("--context-length") + 1] == "4096"
    assert_sglang_accepted(env, "b200")
    assert env.run("h100", "readlink /srv/models/demo--Kimi-K2.6-mini/current").strip().endswith(
        new_rev)
    assert "--context-length" not in standin_argv(env, "h200")

    rc, out = env.pyinfra("-y", *limit(*CONVERGE))
    assert rc == 0, out[-4000:]
    assert changed(out) == {h: [] for h in CONVERGE}
    assert {h: env.starts(h) for h in CONVERGE} == after


# --------------------------------------------------------------------------------------------------
# The status view
# --------------------------------------------------------------------------------------------------


def status_lines(out: str) -> dict[str, str]:
    """The verdict lines of the status table: {host: verdict}."""
    table = out.split("--> Status:\n", 1)[1]
    verdicts = {}
    for line in table.split("\n\n", 1)[1].splitlines():
        if not line.startswith("    "):
            break
        host, verdict = line.strip().split(None, 1)
        verdicts[host] = verdict
    return verdicts


def test_status_of_a_converged_fleet_is_in_sync_and_healthy(env):
    before = {h: env.snapshot(h) for h in CONVERGE}
    rc, out = env.pyinfra("-y", *limit(*CONVERGE), deploy="deploys/status.py")
    assert rc == 0, out[-4000:]
    assert status_lines(out) == {h: "in sync, healthy" for h in CONVERGE}
    assert changed(out) == {h: [] for h in CONVERGE}
    assert {h: env.snapshot(h) for h in CONVERGE} == before
    table = out.split("--> Status:", 1)[1]
    row = next(line for line in table.splitlines() if line.split()[:1] == ["ct200"])
    # CT200 opts in to PR#20547: its port is applied (and proven by the readiness gate).
    assert "0.5.11" in row and "PR#20547 port applied" in row and "healthy" in row
    assert env.demo.revisions[TARGET][:10] in row and env.demo.revisions[DRAFTER][:10] in row


def test_status_reports_drift_without_deploying(env):
    """Settings changed in the inventory but not deployed: the unit differs from the plan; a
    stopped server is down; a wrong SGLang pin is named. Nothing on the hosts changes."""
    inv = env.inventory("drift.py", h200={"plan": {"extra_args": {"--max-running-requests": "8"}}},
                        ct200={"sglang": {"version": "0.5.14"}})
    env.run("b200", f"systemctl stop {UNIT}")
    try:
        before = {h: env.snapshot(h) for h in CONVERGE}
        rc, out = env.pyinfra("-y", *limit(*CONVERGE), deploy="deploys/status.py", inventory=inv)
        assert rc == 0, out[-4000:]
        verdicts = status_lines(out)
        assert verdicts["h200"] == ("drift: unit differs: the next deploy would restart the "
                                    "server; healthy")
        assert verdicts["ct200"] == "drift: SGLang 0.5.11, want 0.5.14; healthy"
        assert verdicts["b200"] == "in sync, down (inactive, nothing on 127.0.0.1:30000)"
        assert verdicts["h100"] == "in sync, healthy"
        assert changed(out) == {h: [] for h in CONVERGE}
        assert {h: env.snapshot(h) for h in CONVERGE} == before
    finally:
        env.run("b200", f"systemctl start {UNIT}")


def test_status_reports_a_change_to_any_of_the_servers_files(env):
    """Every file the deploy writes for the server (the one list: unit, env, logging config, its
    redaction module; the API key file where one is set) changed on the host: status says the
    next deploy would restart the server, naming the file (issue 57: it compared only the unit,
    env and key, and said "in sync")."""
    from specfleet.core.layout import server_paths
    from specfleet.core.settings import settings_from_dict

    host = "h200"
    name = env.demo.settings(host).get("service_name", "specfleet-sglang")
    files = server_paths(settings_from_dict({"service_name": name})).files()
    words = {"unit": "unit", "env": "env", "log_config": "logging config",
             "log_module": "log redaction module"}
    for key, what in words.items():
        path = files[key]
        env.run(host, f"cp -p {path} {path}.sf-test && echo '# changed by hand' >> {path}")
        try:
            rc, out = env.pyinfra("-y", *limit(host), deploy="deploys/status.py")
        finally:
            env.run(host, f"mv -f {path}.sf-test {path}")
        assert rc == 0, out[-4000:]
        assert status_lines(out)[host] == (f"drift: {what} differs: the next deploy would "
                                           "restart the server; healthy"), (key, out[-3000:])


# --------------------------------------------------------------------------------------------------
# --limit isolates: settings are read for the hosts in play only; a bad one fails alone
# --------------------------------------------------------------------------------------------------


def inventory_of(env: Env, path: Path, hosts: dict[str, dict]) -> Path:
    """An inventory of just ``hosts`` ({name: specfleet data}), connected as the fleet's own."""
    f = env.fleet
    connect = {"ssh_user": "root", "ssh_key": str(f.key_path),
               "ssh_strict_host_key_checking": "off", "ssh_known_hosts_file": "/dev/null"}
    rows = [f"    ({h!r}, {{**{connect!r}, 'ssh_hostname': {f.hosts[h]!r}, "
            f"'specfleet': {data!r}}})," for h, data in hosts.items()]
    path.write_text("hosts = [\n" + "\n".join(rows) + "\n]\n")
    return path


def test_limit_isolates_a_host_with_bad_settings(env):
    bad = {**env.demo.settings("h100"), "prot": 30001}
    inv = env.inventory("onebad.py", h100={"prot": 30001})
    # --limit good: the bad host is not in play and its settings are never read.
    rc, out = env.pyinfra("-y", *limit("h200"), inventory=inv)
    assert rc == 0, out[-4000:]
    results = op_results(out)
    assert list(results) == ["h200"], out[-3000:]
    assert all(r in ("Success", "No changes") for r in results["h200"].values()), results
    assert "prot" not in out
    # Both in play (no --limit on an inventory of the two): the bad host fails with its error
    # and fix, changing nothing; the good one still deploys (converged now: no change).
    before = env.snapshot("h100")
    pair = inventory_of(env, env.demo.workdir / "pair.py",
                        {"h200": env.demo.settings("h200"), "h100": bad})
    rc, out = env.pyinfra("-y", inventory=pair)
    assert rc != 0
    assert "[h100] unknown settings key 'prot'" in out, out[-3000:]
    assert "\n  fix: " in out and "Traceback" not in out
    results = op_results(out)
    assert list(results) == ["h200"], out[-3000:]
    assert results["h200"]["Release the run lock"] == "No changes"
    assert set(results["h200"].values()) == {"No changes"}, results
    assert env.snapshot("h100") == before


def test_status_json_is_one_document(env):
    """``specfleet status --json``: stdout is one JSON document with the verdicts the table
    shows; pyinfra's output and the table go to stderr."""
    argv = [sys.executable, "-m", "specfleet.cli", "status", str(env.inventory()),
            *limit("h200", "b200"), "--json"]
    res = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_TOKEN": DEMO_TOKEN})
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["exit_code"] == 0
    assert sorted(doc["hosts"]) == ["b200", "h200"]
    for host, row in doc["hosts"].items():
        assert row["verdict"] == "in sync, healthy", row
        assert row["healthy"] is True and row["drift"] == []
        assert row["sglang"].startswith("0.5.11"), row
        assert f"{host}  in sync, healthy" in res.stderr
    # pyinfra's own --json: its document alone on stdout, the table on stderr.
    rc_res = subprocess.run([PYINFRA, "--json", "-y", str(env.inventory()), *limit("h200"),
                             "deploys/status.py"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "HF_TOKEN": DEMO_TOKEN})
    assert rc_res.returncode == 0, rc_res.stderr[-3000:]
    assert json.loads(rc_res.stdout)["results"]["operations"]
    assert "--> Status:" in rc_res.stderr


# --------------------------------------------------------------------------------------------------
# Preflight, on real hosts
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def preflight_run(env):
    hosts = list(PREFLIGHT)
    before = {h: env.snapshot(h) for h in hosts}
    rc, out = env.pyinfra("-y", *limit(*hosts))
    return rc, out, before


@pytest.mark.parametrize("host", list(PREFLIGHT))
def test_preflight_fails_closed_on_a_real_host(env, preflight_run, host):
    rc, out, before = preflight_run
    assert rc != 0
    results = op_results(out)[host]
    assert results["Hold the run lock"] == "No changes"
    assert results["Preflight"].startswith("Error"), results
    # Nothing after preflight ran on this host, and nothing on it changed (the lock is gone).
    assert list(results) == ["Hold the run lock", "Preflight"], results
    text = host_output(out, host)
    for expected in PREFLIGHT[host][1]:
        assert expected in text, f"{host}: {expected!r} not in\n{text}"
    assert "Traceback" not in out
    assert env.snapshot(host) == before[host]
    assert f"absent {LOCK}" in before[host]


def test_gated_drafter_without_a_token(env):
    """No HF_TOKEN on the control machine: the host with no token of its own fails preflight,
    the CT200-like host (its token at huggingface_hub's default path) passes and changes nothing."""
    before = env.snapshot("notoken")
    rc, out = env.pyinfra("-y", *limit("notoken", "ct200"), token=False)
    assert rc != 0
    text = host_output(out, "notoken")
    assert ("preflight token: demo/Kimi-K2.6-DFlash-mini is gated and there is no Hugging Face "
            "token: none at /root/.cache/huggingface/token on the host and none given on the "
            "control machine") in text
    assert "fix: export HF_TOKEN (or set weights.token_file) on the control machine" in text
    assert env.snapshot("notoken") == before
    assert changed(out)["ct200"] == []
    assert op_results(out)["ct200"]["SGLang server running, enabled and ready"] == "No changes"


# --------------------------------------------------------------------------------------------------
# The run lock
# --------------------------------------------------------------------------------------------------


def _first_line(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def test_run_lock_held_by_another_and_left_by_a_dead_run(env):
    """h100: a lock held from another control machine (another machine id, whose lease runs)
    fails the host with its holder, its expiry and the way to clear it. h200: a lock left by a
    dead run of this control machine is reported and taken over; the run goes on and releases
    it. (tests/fleet/test_lock_fleet.py: expiry, concurrent takers, failures after preflight.)"""
    now = float(env.run("h100", "date +%s.%N"))
    foreign = {"owner": "alice@laptop", "control_host": "laptop", "machine_id": "0" * 32,
               "boot_id": "1" * 32, "pid": 4242, "run_id": "alices-run",
               "started": time.time() - 60, "taken_at": now - 60, "expires_at": now + 600,
               "command": "pyinfra inventories/fleet.py deploys/kimi_k26.py"}
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = {"owner": "bob@" + socket.gethostname(), "control_host": socket.gethostname(),
             "machine_id": _first_line("/etc/machine-id"),
             "boot_id": _first_line("/proc/sys/kernel/random/boot_id"),
             "pid_ns": os.stat("/proc/self/ns/pid").st_ino, "pid": dead.pid,
             "run_id": "bobs-run", "started": time.time() - 3600, "command": "pyinfra x.py deploy.py"}
    for host, lock in (("h100", foreign), ("h200", stale)):
        env.fleet.run(host, f"mkdir -p /var/lib/specfleet && cat > {LOCK}",
                      input=json.dumps(lock), check=True)
    before = env.snapshot("h100")
    try:
        rc, out = env.pyinfra("-y", *limit("h100", "h200"))
        assert rc != 0  # h100 failed
        h100 = host_output(out, "h100")
        assert ("another specfleet run holds this host: alice@laptop (run alices-run, pid 4242 "
                "on machine 00000000, since ") in h100
        assert "its lease expires " in h100
        assert ("fix: wait for that run to end; if it is dead, its lease expires by itself and "
                f"the next run takes the lock over (to clear it sooner, on the host: rm -f {LOCK})"
                ) in h100
        assert list(op_results(out)["h100"]) == ["Hold the run lock"]
        assert op_results(out)["h100"]["Hold the run lock"].startswith("Error")
        assert json.loads(env.run("h100", f"cat {LOCK}")) == foreign
        assert env.snapshot("h100") == before

        h200 = host_output(out, "h200")
        assert (f"a lock left by a dead run of bob@{socket.gethostname()} (run bobs-run, pid "
                f"{dead.pid} on machine " in h200 and "is taken over" in h200)
        assert changed(out)["h200"] == []
        assert op_results(out)["h200"]["Release the run lock"] == "No changes"
        assert env.run("h200", f"test -e {LOCK} && echo held || echo free").strip() == "free"
        assert "Traceback" not in out
    finally:
        env.run("h100", f"rm -f {LOCK}")


# --------------------------------------------------------------------------------------------------
# Bad inventory data, through the real CLI
# --------------------------------------------------------------------------------------------------

BAD = [
    ("unknown key", {"prot": 30001}, "unknown settings key 'prot'"),
    ("wrong type", {"port": "30001"}, "settings key 'port' is '30001' (str), expected an integer"),
    ("nested unknown key", {"plan": {"tp_sise": 2}}, "unknown settings key 'plan.tp_sise'"),
    ("bad revision", {"target": {"revision": "main"}},
     "settings key 'target.revision' is 'main', which is not a commit sha"),
    ("bad literal", {"weights": {"verify": "paranoid"}},
     "settings key 'weights.verify' is 'paranoid' (str), expected 'fast' or 'deep'"),
    ("specfleet not a dict", "port=30001", "'specfleet' data is str, expected a mapping"),
    ("bad port", {"port": 70000}, "settings key 'port' is 70000, expected 1..65535"),
    ("patch without sha256", {"patch": {"source": "/tmp/pr20547.diff"}},
     "settings key 'patch.source' is set without 'patch.sha256'"),
    ("list item type", {"sglang": {"trusted_hosts": ["10.0.0.1", 5]}},
     "settings key 'sglang.trusted_hosts[1]' is 5 (int), expected a string"),
    ("section not a mapping", {"plan": ["--tp-size", "2"]},
     "settings key 'plan' is ['--tp-size', '2'] (list), expected a mapping (section PlanOverrides)"),
    ("mem fraction out of range", {"plan": {"mem_fraction_static": 1.2}},
     "settings key 'plan.mem_fraction_static' is 1.2, expected a number in (0, 1)"),
]


@pytest.mark.parametrize("data, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_inventory_data_is_a_clear_error_and_changes_nothing(env, data, message):
    host = "h200"
    good = env.demo.settings(host, **env.over[host])
    # The host's specfleet data with the bad value merged in (or replaced by it).
    bad = {**good, **data} if isinstance(data, dict) else data
    inv = env.fleet.write_inventory(env.demo.workdir / "bad.py",
                                    host_data={host: {"specfleet": bad}})
    before = env.snapshot(host)
    rc, out = env.pyinfra("-y", *limit(host), inventory=inv)
    assert rc != 0
    assert f"[{host}] {message}" in out, out[-3000:]
    assert "\n  fix: " in out
    assert "Traceback" not in out
    assert "--> Starting operation" not in out
    assert env.snapshot(host) == before


# --------------------------------------------------------------------------------------------------
# PR#20547 on the CT200-like host (it opts in, as inventories/ct200.py does): the port is proven by
# the readiness gate, and rolled back by a failing one. Last: it changes ct200 and puts it back.
# --------------------------------------------------------------------------------------------------

SITE_0511 = "/root/venv_sglang211/lib/python3.11/site-packages"
PATCH_DIR = "/root/venv_sglang211/.specfleet/pr20547"


def unit_env(env: Env, host: str) -> str:
    return env.run(host, "cat /etc/specfleet/specfleet-sglang.env")


def test_ct200_runs_the_port_and_a_failed_gate_rolls_it_back(env):
    assert PR20547_TARBALL.is_file()
    # Converged by the tests above: the port is applied, proven, and the server has the switches.
    assert env.run("ct200", f"test -f {PATCH_DIR}/sha256 && echo yes").strip() == "yes"
    assert env.run("ct200", f"test -e {PATCH_DIR}/unproven || echo proven").strip() == "proven"
    assert 'SGLANG_ENABLE_DFLASH_SPEC_V2="1"' in unit_env(env, "ct200")
    assert env.run("ct200", f"test -f {SITE_0511}/sglang/srt/speculative/dflash_worker_v2.py "
                            "&& echo yes").strip() == "yes"  # fmt: skip

    # Off: the port is removed, the unit loses the switches, one restart.
    env.over["ct200"] = {"patch": {"source": None, "sha256": None}}
    rc, out = env.pyinfra("-y", *limit("ct200"))
    assert rc == 0, out[-4000:]
    assert "removes PR#20547 port" in out
    assert "SGLANG_ENABLE_DFLASH_SPEC_V2" not in unit_env(env, "ct200")

    # On again, with a server that crashes under the v2 switch: the gate fails, the port applied
    # in this run is rolled back and remembered, and the host fails with both said.
    launcher = env.demo.settings("ct200")["launcher"]
    failing = {"launcher": [*launcher, "--standin-fail-if-env", "SGLANG_ENABLE_DFLASH_SPEC_V2"],
               "readiness_timeout_s": 20.0}  # fmt: skip
    env.over["ct200"] = failing
    rc, out = env.pyinfra("-y", *limit("ct200"))
    assert rc != 0
    assert "SGLang 0.5.11: applies the PR#20547 port for SGLang 0.5.11" in out
    assert "rolled back the PR#20547 port applied in this run" in out
    assert "Traceback" not in out
    assert env.run("ct200", f"test -e {PATCH_DIR}.rejected && echo yes").strip() == "yes"
    assert env.run("ct200", f"test -e {PATCH_DIR} || echo gone").strip() == "gone"
    assert env.run("ct200", f"test -e {SITE_0511}/sglang/srt/speculative/dflash_worker_v2.py "
                            "|| echo gone").strip() == "gone"  # fmt: skip

    # The next run keeps v1 (said, with the fix), restarts on v1 and passes its gate.
    rc, out = env.pyinfra("-y", *limit("ct200"))
    assert rc == 0, out[-4000:]
    assert "failed the readiness gate on this host and was rolled back" in out
    assert "SGLANG_ENABLE_DFLASH_SPEC_V2" not in unit_env(env, "ct200")
    rc, out = env.pyinfra("-y", *limit("ct200"))
    assert rc == 0 and changed(out)["ct200"] == [], out[-4000:]

    # Put ct200 back: forget the rejection, default settings; the port is applied and proven.
    env.run("ct200", f"rm -f {PATCH_DIR}.rejected")
    env.over["ct200"] = {}
    rc, out = env.pyinfra("-y", *limit("ct200"))
    assert rc == 0, out[-4000:]
    assert env.run("ct200", f"test -e {PATCH_DIR}/unproven || echo proven").strip() == "proven"
    assert 'SGLANG_ENABLE_DFLASH_SPEC_V2="1"' in unit_env(env, "ct200")



# --------------------------------------------------------------------------------------------------
# Removal, and a deploy after it (last: it takes the deploy off ct200 and h200 and puts it back)
# --------------------------------------------------------------------------------------------------

REMOVED = ["ct200", "h200"]
# What specfleet put on a host besides the weights and the venv (operations.removal.footprint).
FOOTPRINT = (f"/etc/systemd/system/{UNIT} /etc/specfleet /opt/specfleet/tools "
             "/var/lib/specfleet/hf /var/lib/specfleet/rollback /var/lib/specfleet/weights "
             f"/var/lib/specfleet/specfleet-sglang.restart-pending {LOCK}")


def specfleet_cli(env: Env, *args: str) -> tuple[int, str]:
    environ = {**os.environ, "HF_TOKEN": DEMO_TOKEN}
    res = subprocess.run([sys.executable, "-m", "specfleet.cli", *args], cwd=REPO_ROOT,
                         env=environ, capture_output=True, text=True, timeout=900)
    return res.returncode, res.stdout + res.stderr


def leftovers(env: Env, host: str) -> str:
    """What of specfleet's footprint (and its units) is on the host, and what is kept."""
    return env.run(host, (
        f"for p in {FOOTPRINT}; do test -e $p && echo left $p; done; "
        "ls -A /var/lib/specfleet 2>/dev/null | sed 's/^/state: /'; "
        "systemctl list-units --all --plain --no-legend --no-pager 'specfleet*' "
        "| awk '$3 != \"inactive\" {print \"unit: \" $1, $2, $3}'; "
        "curl -s --max-time 3 http://127.0.0.1:30000/health >/dev/null && echo serving; true"))


def weights_digest(env: Env, host: str) -> str:
    return env.run(host, "cd /srv/models && find . -path ./.cache -prune -o -type f "
                         "-printf '%p %s %T@\\n' | sort | sha256sum")


def test_removal_then_deploy_converges_again(env):
    inv = env.inventory()
    rc, out = env.pyinfra("-y", *limit(*REMOVED), inventory=inv)
    assert rc == 0, out[-4000:]
    weights = {h: weights_digest(env, h) for h in REMOVED}
    assert env.run("ct200", f"test -f {PATCH_DIR}/sha256 && echo patched").strip() == "patched"

    # --dry says what would go and changes nothing.
    state = {h: host_state(env, h) for h in REMOVED}
    rc, out = specfleet_cli(env, "remove", str(inv), *limit(*REMOVED), "--dry")
    assert rc == 0, out[-4000:]
    said = host_output(out, "h200")
    assert "removal: stops specfleet-sglang" in said
    for unit in ("specfleet-sglang.service", "specfleet-sglang-watchdog.service"):
        assert f"stops {unit}" in said, said
    assert {h: host_state(env, h) for h in REMOVED} == state

    # Remove: the server stops, every file specfleet put there goes; the weights stay, and so
    # does CT200's own venv, with the PR#20547 port undone (the wheel's RECORD holds again).
    rc, out = specfleet_cli(env, "remove", str(inv), *limit(*REMOVED))
    assert rc == 0, out[-4000:]
    assert changed(out) == {h: ["Specfleet's deploy removed"] for h in REMOVED}, out[-4000:]
    assert "restores PR#20547 in /root/venv_sglang211" in out
    for host in REMOVED:
        assert leftovers(env, host) == "", (host, leftovers(env, host))
        assert weights_digest(env, host) == weights[host]
    assert env.run("h200", "test -e /opt/specfleet && echo left || echo gone").strip() == "gone"
    assert env.run("ct200", f"test -e /root/venv_sglang211/.specfleet || echo gone; "
                            f"/root/venv_sglang211/bin/python -c '{RECORD_CHECK}' {SITE_0511}"
                   ).split() == ["gone", "record:", "ok"]
    state = {h: host_state(env, h) for h in REMOVED}

    # Again: nothing left to remove, nothing changes (-v: pyinfra prints the no-op messages).
    rc, out = specfleet_cli(env, "remove", str(inv), *limit(*REMOVED), "-v")
    assert rc == 0, out[-4000:]
    assert changed(out) == {h: [] for h in REMOVED}, out[-4000:]
    assert "specfleet's deploy is absent (the venv /root/venv_sglang211 and the weights kept)" in out
    assert {h: host_state(env, h) for h in REMOVED} == state

    # A deploy converges again (no download: the weights were kept), and the next changes nothing.
    rc, out = env.pyinfra("-y", *limit(*REMOVED), inventory=inv)
    assert rc == 0, out[-4000:]
    for host in REMOVED:
        settings = settings_from_dict(env.demo.settings(host), host=host)
        assert model_info(env, host)["model_path"] == serve_path(settings, "target")
        # The weights agent's tools went with /opt/specfleet and come back; the models do not.
        assert not [op for op in changed(out)[host]
                    if op.startswith(("Target weights", "Drafter weights"))], changed(out)[host]
    assert env.run("ct200", f"test -f {PATCH_DIR}/sha256 && echo patched").strip() == "patched"
    rc, out = env.pyinfra("-y", *limit(*REMOVED), inventory=inv)
    assert rc == 0, out[-4000:]
    assert changed(out) == {h: [] for h in REMOVED}
