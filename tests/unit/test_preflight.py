"""specfleet.core.preflight.check and the run lock's verdict, as pure functions (milliseconds).

Facts are real wherever they can be: GPU facts are the facts helper's parsers run on the real
nvidia-smi captures (tests.unit.test_plan.gpus_fact), SGLang installs are read from the real wheels
(tests/fixtures/sglang), GPU processes and listening ports are the facts' own recorded fixtures
(tests/facts/). The fleet versions of these cases are in tests/fleet/test_deploy_fleet.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from operations.preflight import lock_verdict
from specfleet.core.plan import GIB
from specfleet.core.preflight import FREE_SPACE, GPU_PROCESSES, PORTS, SERVICE, TOKEN, check
from specfleet.core.runlock import expires_at, lock_status
from specfleet.core.settings import settings_from_dict
from tests.unit.test_plan import host_facts, profile_exists

FACT_FIXTURES = Path(__file__).parents[1] / "specs" / "facts"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# CT200 as its owner describes it (issue 8): 593 GiB free on /, Kimi K2.6 554.3 GiB + the DFlash
# drafter 6.5 GiB still to download, 8x RTX PRO 6000, SGLang 0.5.11 in /root/venv_sglang211.
CT200_FREE = int(593 * GIB)
CT200_MISSING = int(554.3 * GIB) + int(6.5 * GIB)


def recorded(fact: str, name: str):
    """The value a fact computed on recorded real output (tests/facts/<fact>/<name>.yaml)."""
    return yaml.safe_load((FACT_FIXTURES / fact / f"{name}.yaml").read_text())["fact"]


def facts_for(profile: str = "rtx6000x8", sglang: str | None = "0.5.11", *, free=CT200_FREE,
              token: bool = True, processes=None, ports=None, service=None) -> dict:
    facts = host_facts(profile, sglang=sglang)
    facts[FREE_SPACE] = {"path": "/root/models", "mount": "/", "total_bytes": free * 2,
                         "free_bytes": free}
    facts[TOKEN] = {"path": "/root/.cache/huggingface/token", "exists": token}
    facts[GPU_PROCESSES] = {"processes": processes or [], "error": None}
    facts[PORTS] = ports or []
    facts[SERVICE] = service or {"active_state": "inactive", "main_pid": 0}
    return facts


def ct200_settings(**over):
    data = {"venv": "/root/venv_sglang211", "models_root": "/root/models",
            "sglang": {"version": "0.5.11"},
            "target": {"revision": COMMIT}, "drafter": {"revision": COMMIT, "gated": True}}
    data.update(over)
    return settings_from_dict(data, host="ct200")


def checks(result):
    return [p.check for p in result.problems]



@pytest.mark.local
def test_ct200_real_numbers_pass_with_low_headroom_warning():
    result = check(facts_for(), ct200_settings(), missing_weights_bytes=CT200_MISSING)
    assert result.ok, [p.render() for p in result.problems]
    (warning,) = [w for w in result.warnings if "headroom" in w]
    # 593 - 560.8 = 32.2 GiB left, 5.4 % of the free space: under the 10 % warning line.
    assert "low disk headroom at /root/models" in warning
    assert "560.8 GiB" in warning and "5.4 %" in warning and "593.0 GiB" in warning
    assert "the missing weights fit on the models disk" in result.passed
    assert any("launch plan" in p for p in result.passed)


@pytest.mark.local
def test_ct200_with_less_free_space_fails_with_the_shortfall():
    # 2 % margin of 560.8 GiB = 11.2 GiB; 565 GiB free is short by 7.0 GiB.
    result = check(facts_for(free=int(565 * GIB)), ct200_settings(),
                   missing_weights_bytes=CT200_MISSING)
    assert checks(result) == ["disk"]
    text = result.problems[0].render()
    assert "not enough disk space at /root/models" in text
    assert "560.8 GiB still to download + 11.2 GiB margin = 572.0 GiB needed" in text
    assert "short by 7.0 GiB" in text and "fix: free at least 7.0 GiB" in text


@pytest.mark.local
def test_weights_already_there_need_no_disk():
    result = check(facts_for(free=int(1 * GIB)), ct200_settings(), missing_weights_bytes=0)
    assert result.ok and not any("headroom" in w for w in result.warnings)


@pytest.mark.local
def test_unknown_missing_bytes_defer_the_disk_check_with_a_warning():
    result = check(facts_for(free=0), ct200_settings(), missing_weights_bytes=None)
    assert result.ok
    assert any("checks them against the free space before any byte moves" in w
               for w in result.warnings)


@pytest.mark.local
def test_no_gpu():
    facts = facts_for("rtx6000x8" if profile_exists("rtx6000x8") else "h200x2")
    facts["facts.gpu.Gpus"] = {"gpus": [], "error": None}
    result = check(facts, ct200_settings(), missing_weights_bytes=0)
    assert checks(result) == ["plan"]
    assert "no GPUs" in result.problems[0].problem
    assert "working driver" in result.problems[0].fix


@pytest.mark.local
@pytest.mark.parametrize("profile, quoted", [
    ("driver-mismatch", "Failed to initialize NVML: Driver/library version mismatch"),
    ("no-driver", "NVIDIA-SMI has failed"),
])
def test_broken_nvidia_smi_is_quoted(profile, quoted):
    result = check(facts_for(profile), ct200_settings(), missing_weights_bytes=0)
    assert checks(result) == ["plan"]
    assert quoted in result.problems[0].problem


@pytest.mark.local
def test_fewer_gpus_than_tp_size():
    result = check(facts_for(), ct200_settings(plan={"tp_size": 16}), missing_weights_bytes=0)
    assert checks(result) == ["plan"]
    assert "--tp-size 16 needs 16 GPUs, the host has 8" in result.problems[0].problem
    assert "set plan.tp_size to at most 8" in result.problems[0].fix


@pytest.mark.local
def test_attention_backend_not_in_the_registry():
    result = check(facts_for(), ct200_settings(plan={"attention_backend": "no_such_backend"}),
                   missing_weights_bytes=0)
    assert checks(result) == ["plan"]
    assert "'no_such_backend'" in result.problems[0].problem


@pytest.mark.local
def test_old_driver_without_compute_cap():
    result = check(facts_for("old-driver"), ct200_settings(), missing_weights_bytes=0)
    assert checks(result) == ["plan"]
    assert "compute capability unknown" in result.problems[0].problem
    assert "compute_cap" in result.problems[0].problem
    assert "driver >= 510" in result.problems[0].fix


@pytest.mark.local
def test_gpu_memory_too_small_for_kimi():
    # 2x H200 (143771 MiB each) against Kimi K2.6 + DFlash (560.8 GiB): the default target.
    result = check(facts_for("h200x2"), settings_from_dict({}, host="h"), missing_weights_bytes=0,
                   control_token=True)
    assert checks(result) == ["plan"]
    assert "2 GPUs hold 281 GiB in all, far below the 561 GiB of weights" in (
        result.problems[0].problem)


@pytest.mark.local
def test_busy_gpus_name_the_processes():
    busy = recorded("gpu.GpuProcesses", "busy")
    result = check(facts_for(processes=busy["processes"]), ct200_settings(),
                   missing_weights_bytes=0)
    assert checks(result) == ["gpus-busy"]
    assert "pid 269473 (96860 MiB)" in result.problems[0].problem
    assert "a hand-started server" in result.problems[0].fix


@pytest.mark.local
def test_our_own_running_server_does_not_make_the_gpus_busy():
    busy = recorded("gpu.GpuProcesses", "busy")
    ours = {"active_state": "active", "main_pid": 5120}
    result = check(facts_for(processes=busy["processes"], service=ours), ct200_settings(),
                   missing_weights_bytes=0)
    assert result.ok


@pytest.mark.local
def test_port_taken_by_a_process_that_is_not_our_unit():
    ports = recorded("net.ListeningPorts", "sshd_and_server")
    result = check(facts_for(ports=ports), ct200_settings(), missing_weights_bytes=0)
    assert checks(result) == ["port-taken"]
    assert ("port 30000 is already taken by a process that is not specfleet-sglang: "
            "python3 (pid 5120) on 127.0.0.1") in result.problems[0].problem
    # Our unit's own main pid on the port is no problem; another port is no problem either.
    assert check(facts_for(ports=ports, service={"active_state": "active", "main_pid": 5120}),
                 ct200_settings(), missing_weights_bytes=0).ok
    assert check(facts_for(ports=ports), ct200_settings(port=30001), missing_weights_bytes=0).ok


@pytest.mark.local
def test_gated_drafter_without_any_token():
    result = check(facts_for(token=False), ct200_settings(), missing_weights_bytes=1 << 20)
    assert checks(result) == ["token"]
    assert "is gated and there is no Hugging Face token" in result.problems[0].problem
    assert "/root/.cache/huggingface/token" in result.problems[0].problem
    assert "export HF_TOKEN" in result.problems[0].fix
    assert checks(check(facts_for(token=False), ct200_settings())) == ["token"]  # unknown
    assert check(facts_for(token=False), ct200_settings(), missing_weights_bytes=1 << 20,
                 control_token=True).ok
    ungated = ct200_settings(drafter={"revision": COMMIT, "gated": False})
    assert check(facts_for(token=False), ungated, missing_weights_bytes=1 << 20).ok


@pytest.mark.local
def test_no_token_with_every_weights_file_present_is_said_and_goes_on():
    """The token is an optional input when nothing is left to download: a warning that says
    what it changes (the next revision needs one), not a failure."""
    result = check(facts_for(token=False), ct200_settings(), missing_weights_bytes=0)
    assert result.ok
    (said,) = [w for w in result.warnings if "Hugging Face token" in w]
    assert "none needed now" in said and "another revision will need one" in said


@pytest.mark.local
def test_a_converged_host_needs_no_token_on_the_control_machine():
    """The copy an earlier run put on the host (weights.token) is a token: no HF_TOKEN needed."""
    copy = "/etc/specfleet/hf-token"
    result = check(facts_for(token=False), ct200_settings(), missing_weights_bytes=0,
                   host_copy=copy)  # fmt: skip
    assert result.ok
    assert any(f"specfleet's copy on the host, {copy}" in p for p in result.passed)


@pytest.mark.local
def test_sglang_without_dflash_from_the_version_table():
    # Nothing installed yet: the plan is predicted from specfleet.core.tables.sglang_versions for 0.5.10.
    result = check(facts_for(sglang=None), ct200_settings(sglang={"version": "0.5.10"}),
                   missing_weights_bytes=0)
    assert checks(result) == ["plan"]
    assert "SGLang 0.5.10 has no DFLASH speculative decoding" in result.problems[0].problem
    assert "sglang >= 0.5.11" in result.problems[0].fix


@pytest.mark.local
def test_no_wheel_quotes_pip():
    pip = ("ERROR: Could not find a version that satisfies the requirement sglang==0.5.13 "
           "(from versions: 0.5.11, 0.5.14, 0.5.23)\n"
           "ERROR: No matching distribution found for sglang==0.5.13")
    result = check(facts_for(sglang=None), ct200_settings(sglang={"version": "0.5.14"}),
                   missing_weights_bytes=0, wheel_error=pip)
    assert checks(result) == ["sglang-wheel"]
    assert "No matching distribution found for sglang==0.5.13" in result.problems[0].problem
    assert "sglang.find_links" in result.problems[0].fix


@pytest.mark.local
def test_every_problem_is_reported_not_only_the_first():
    busy = recorded("gpu.GpuProcesses", "busy")
    result = check(facts_for(processes=busy["processes"], token=False, free=int(GIB)),
                   ct200_settings(plan={"tp_size": 16}), missing_weights_bytes=CT200_MISSING)
    assert checks(result) == ["plan", "gpus-busy", "disk", "token"]
    assert all(p.render().startswith(f"preflight {p.check}: ") and "\n  fix: " in p.render()
               for p in result.problems)


# --------------------------------------------------------------------------------------------------
# The run lock
# --------------------------------------------------------------------------------------------------

ME = {"owner": "ops@laptop", "control_host": "laptop", "machine_id": "m" * 32, "boot_id": "b" * 32,
      "pid_ns": 4026531836, "pid": 100, "pid_start": 5000, "run_id": "run-of-me", "started": 0.0, "command": "x"}
NOW = 1_800_000_000.0


def never(pid, start=None):
    return False


def always(pid, start=None):
    return True


def test_lock_free_is_taken():
    assert lock_verdict(None, ME, always) == ("take", None)


def test_lock_of_this_run_is_ours():
    assert lock_verdict(dict(ME), ME, always)[0] == "ours"


def test_lock_of_this_run_id_is_ours_from_another_process_too():
    """A controller's steps share SPECFLEET_RUN_ID: a step re-enters the lock an earlier one left
    (another pid, still alive or not) instead of waiting for its lease."""
    held = {**ME, "pid": 4242, "pid_start": 1, "expires_at": NOW + 100}
    assert lock_verdict(held, ME, always, NOW)[0] == "ours"


def test_lock_of_a_dead_run_here_is_stale_and_taken_over():
    held = {**ME, "pid": 4242, "run_id": "other-run", "command": "pyinfra inv.py deploy.py",
            "expires_at": NOW + 100}
    verdict, message = lock_verdict(held, ME, lambda pid, start=None: pid != 4242, NOW)
    assert verdict == "stale"
    assert "a lock left by a dead run of ops@laptop (run other-run, pid 4242 on machine mmmmmmmm" \
        in message
    assert "taken over" in message


def test_a_recycled_pid_is_not_the_run_that_took_the_lock():
    """The pid lives, but it is another process now (another start time): the run is dead."""
    held = {**ME, "pid": 4242, "pid_start": 7, "run_id": "other-run", "expires_at": NOW + 100}
    seen = []

    def alive(pid, start=None):
        seen.append((pid, start))
        return start != 7  # /proc/4242/stat says it started at another time

    assert lock_verdict(held, ME, alive, NOW)[0] == "stale"
    assert seen == [(4242, 7)]


def test_another_boot_with_this_machine_id_waits_for_the_lease():
    """Another boot id with this machine id is a reboot, or a clone of this machine's image
    (same /etc/machine-id) whose run may be alive: its lock is left to its lease."""
    held = {**ME, "boot_id": "c" * 32, "pid": 4242, "run_id": "other-run",
            "expires_at": NOW + 100}
    assert lock_verdict(held, ME, never, NOW)[0] == "busy"
    assert lock_verdict({**held, "expires_at": NOW - 1}, ME, never, NOW)[0] == "expired"


@pytest.mark.parametrize("other", [
    {"pid_ns": 4026532999},  # a container, or `unshare --pid`: its pid means nothing here
    {"pid_ns": None},  # a lock of an older specfleet: its namespace is not known
])
def test_a_live_lock_of_another_pid_namespace_is_busy_until_its_lease_ends(other):
    """Containers on one kernel share the boot id and often the machine id: a pid of another pid
    namespace looks dead from this one. Only the lease frees such a lock."""
    held = {**ME, **other, "pid": 4242, "run_id": "other-run", "expires_at": NOW + 170}
    verdict, message = lock_verdict(held, ME, never, NOW)
    assert verdict == "busy", message
    assert message.startswith("another specfleet run holds this host: ")
    assert lock_verdict({**held, "expires_at": NOW - 1}, ME, never, NOW)[0] == "expired"
    # The same namespace, the pid gone: stale.
    assert lock_verdict({**held, "pid_ns": ME["pid_ns"]}, ME, never, NOW)[0] == "stale"


def test_same_host_name_on_another_machine_is_another_owner():
    """The owner is the machine id, not the host name: a run on another machine called "laptop"
    (its pid means nothing here) is busy until its lease runs out."""
    held = {**ME, "machine_id": "n" * 32, "pid": 4242, "run_id": "other-run",
            "expires_at": NOW + 100}
    verdict, message = lock_verdict(held, ME, never, NOW)
    assert verdict == "busy"
    assert message.startswith("another specfleet run holds this host: ops@laptop (run other-run")
    assert "its lease expires " in message and "(in 100 s)" in message


def test_an_expired_lease_is_taken_over_whoever_left_it():
    held = {**ME, "machine_id": "n" * 32, "owner": "alice@box", "pid": 4242,
            "run_id": "other-run", "expires_at": NOW - 30}
    verdict, message = lock_verdict(held, ME, always, NOW)
    assert verdict == "expired"
    assert "a lock left by alice@box" in message and "expired" in message and "(30 s ago)" in \
        message
    # Unexpired (or no host clock to judge by): busy.
    assert lock_verdict({**held, "expires_at": NOW + 1}, ME, always, NOW)[0] == "busy"
    assert lock_verdict(held, ME, always, None)[0] == "busy"


def test_a_lock_without_a_lease_expires_a_lease_after_it_was_written():
    """A lock of an older specfleet (no expires_at), or an unreadable one, counts its lease from
    the file's mtime."""
    legacy = {"owner": "bob@laptop", "control_host": "laptop", "pid": 4242, "mtime": NOW - 300}
    assert expires_at(legacy, 180.0) == NOW - 120
    assert lock_verdict(legacy, ME, always, NOW)[0] == "expired"
    assert lock_verdict({**legacy, "mtime": NOW - 10}, ME, always, NOW)[0] == "busy"


@pytest.mark.parametrize("held", [
    {**ME, "pid": 4242, "run_id": "other-run"},  # a live run on this machine
    {**ME, "machine_id": "o" * 32, "pid": 4242, "run_id": "x"},  # elsewhere: its pid means nothing
    {"owner": "unknown", "unreadable": "garbage"},  # a lock file nobody can read
])
def test_lock_held_by_another_run_is_busy(held):
    verdict, message = lock_verdict(held, ME, always)
    assert verdict == "busy"
    assert message.startswith("another specfleet run holds this host: ")
    assert held["owner"] in message


def test_the_status_shows_holder_since_and_expiry():
    assert lock_status(None, NOW) == "free"
    held = {**ME, "taken_at": NOW - 60, "expires_at": NOW + 95}
    text = lock_status(held, NOW)
    assert text.startswith("held by ops@laptop (run run-of-me, pid 100 on machine mmmmmmmm, "
                           "since ")
    assert text.endswith("(in 95 s)")
    gone = lock_status({**held, "expires_at": NOW - 600}, NOW)
    assert "(10 min ago): the next run takes it over" in gone


@pytest.mark.local
def test_a_unit_file_specfleet_did_not_write_is_refused():
    """service_name of a unit the host has (issue 55: ``ssh`` shadowed sshd): preflight refuses
    it, naming the file and its first line, before anything changes; a unit specfleet wrote (its
    header) is no problem."""
    from facts.serving import UnitFiles, parse_unit_files
    from specfleet.core.preflight import UNIT_FILES

    ours = "/etc/systemd/system/specfleet-sglang.service"
    cmd = UnitFiles().command(names=["specfleet-sglang.service"])
    assert f"test -e {ours}" in cmd and "/lib/systemd/system/specfleet-sglang.service" in cmd
    facts = facts_for()
    facts[UNIT_FILES] = parse_unit_files(["##path " + ours, "# Managed by specfleet (x). Edits"])
    assert check(facts, ct200_settings(), missing_weights_bytes=0).ok
    facts[UNIT_FILES] = parse_unit_files([
        "##path " + ours, "[Unit]\x1b[31m", "Description=mine",
        "##path /lib/systemd/system/specfleet-sglang.service", "# Managed by specfleet (x)"])
    result = check(facts, ct200_settings(), missing_weights_bytes=0)
    assert checks(result) == ["unit-name"]
    problem = result.problems[0]
    assert ours + " (first line '[Unit]?[31m')" in problem.problem
    assert "/lib/systemd/system/specfleet-sglang.service (first line" in problem.problem
    assert "a unit of the host" in problem.problem and "\x1b" not in problem.problem
    assert "set service_name to a name of specfleet's own" in problem.fix


@pytest.mark.local
def test_a_venv_or_source_tree_others_can_write_is_refused(tmp_path):
    """Issue 55: root ran pip's build backend from a world-writable source tree, and a venv's
    .pth files. The fact, run here for real: a folder above (the sticky, world-writable /tmp),
    or a file inside the tree others may write; then preflight refuses, naming the place."""
    from facts.preflight import WritableByOthers
    from specfleet.core.preflight import UNTRUSTED

    tree = tmp_path / "sglang" / "python"
    (tree / "sglang").mkdir(parents=True)
    (tree / "sglang" / "build.py").write_text("x")
    os.chmod(tree / "sglang" / "build.py", 0o666)
    fact = WritableByOthers()
    import subprocess

    def run(**kw):
        out = subprocess.run(["sh", "-c", fact.command(**kw)], capture_output=True, text=True,
                             timeout=60)
        return fact.process(out.stdout.splitlines())

    assert run(paths=[str(tree)], trees=[str(tree)]) == {
        str(tree): f"{tree}/sglang/build.py (uid {os.getuid()}, mode 666)"}
    # Not there yet: checked from its nearest folder up (the temporary folders are others').
    nowhere = str(tmp_path / "no" / "venv")
    found = run(paths=[nowhere])[nowhere].split(" (")[0]
    assert found in [str(tmp_path), *map(str, tmp_path.parents)], found
    assert run(paths=["/usr/lib"]) == {} or os.getuid() != 0
    facts = facts_for()
    facts[UNTRUSTED] = {"/root/venv_sglang211": "/root (uid 1000, mode 775)"}
    result = check(facts, ct200_settings(), missing_weights_bytes=0)
    assert checks(result) == ["untrusted-path"]
    assert "venv /root/venv_sglang211 can be changed by a user other than root: /root (uid " \
           "1000, mode 775)" in result.problems[0].problem
    assert "chmod go-w on /root" in result.problems[0].fix


@pytest.mark.local
def test_a_venv_whose_site_packages_or_pth_files_others_can_write_is_refused(tmp_path):
    """Issue 55: a .pth file in the venv's site-packages is code its Python runs as it starts.
    The venv's top levels (bin, pyvenv.cfg, site-packages and what is directly in it) are
    checked too, not the venv folder and its parents alone."""
    import subprocess

    from facts.preflight import WritableByOthers, trust_args

    env = tmp_path / "venv"
    site = env / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (env / "bin").mkdir()
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "torch").mkdir()
    (site / "torch" / "deep.py").write_text("x")
    os.chmod(site / "torch" / "deep.py", 0o666)  # deeper than the top levels: not looked at
    fact = WritableByOthers()

    def run(**kw):
        out = subprocess.run(["sh", "-c", fact.command(**kw)], capture_output=True, text=True,
                             timeout=60)
        return fact.process(out.stdout.splitlines())

    args = trust_args(str(env))
    assert args == {"paths": [str(env)], "trees": [], "venvs": [str(env)]}
    # Nothing of the venv's own: the first place found is above it (the temporary folders).
    first = run(**args)[str(env)].split(" (")[0]
    assert first in [str(tmp_path), *map(str, tmp_path.parents)], first
    (site / "user.pth").write_text("import os\n")
    os.chmod(site / "user.pth", 0o666)
    assert run(**args) == {str(env): f"{site}/user.pth (uid {os.getuid()}, mode 666)"}
    os.chmod(site / "user.pth", 0o644)
    os.chmod(site, 0o777)
    assert run(**args) == {str(env): f"{site} (uid {os.getuid()}, mode 777)"}
    os.chmod(site, 0o755)
    os.chmod(env / "pyvenv.cfg", 0o664)
    assert run(**args) == {str(env): f"{env}/pyvenv.cfg (uid {os.getuid()}, mode 664)"}


def test_the_wheel_check_never_runs_pip_of_a_venv_others_can_change():
    """Issue 55: preflight's wheel check ran the venv's pip (its .pth files, pip itself) before
    it refused a venv a user other than root can change, at --dry too."""
    from operations.preflight import wheel_check_python
    from specfleet.core.preflight import SGLANG, UNTRUSTED

    s = ct200_settings(sglang={"version": "0.5.14"})
    facts = {SGLANG: {"version": "0.5.11"}, "facts.python.Packages": {"python_version": "3.11.2"},
             UNTRUSTED: {}}
    assert wheel_check_python(s, facts) == "/root/venv_sglang211/bin/python"
    facts[UNTRUSTED] = {"/root/venv_sglang211": "/root (uid 1000, mode 775)"}
    assert wheel_check_python(s, facts) is None  # preflight refuses the venv (untrusted-path)
    # No venv Python yet: the interpreter that makes it; the release installed: no check.
    assert wheel_check_python(s, {**facts, "facts.python.Packages": {}}) == s.python
    assert wheel_check_python(s, {**facts, SGLANG: {"version": "0.5.14"}}) is None

