"""The CLI's promises on one real host, a CT200-like demo host (tests/demo.py): `pyinfra
inventories/ct200.py deploys/kimi_k26.py --dry` from a fresh clone, aimed at the demo host by a
`--data` override of the address (never CT200's own), prints the launch plan; on the converged
host `specfleet rollout --dry` reports no change and plain `--dry` no conditional one; an
unreachable host (an address of this fleet's subnet with no host behind it), a missing token, a
host without systemctl and a user who cannot read the secrets each end with the documented exit
code, the named fix, no traceback and no hang.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time

import pytest

from tests.demo import DEMO_TOKEN, PYINFRA, REPO_ROOT, up
from tests.harness import HostSpec

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(1800)]

DEPLOY = "deploys/kimi_k26.py"
HOST = "ct200"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    d = up("cli", hosts=[HostSpec(HOST, gpu="rtx6000x8", disk="593G")],
           workdir=tmp_path_factory.mktemp("cli-demo"))
    try:
        yield d
    finally:
        d.down()


def environ(token: bool = True, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    if token:
        env["HF_TOKEN"] = DEMO_TOKEN
    return {**env, **extra}


def run(argv: list[str], env: dict[str, str] | None = None,
        timeout: float = 600) -> tuple[int, str, str, float]:
    start = time.monotonic()
    res = subprocess.run(argv, cwd=REPO_ROOT, env=env or environ(), capture_output=True,
                         text=True, timeout=timeout)
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    return res.returncode, res.stdout, res.stderr, time.monotonic() - start


def specfleet(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    return run([sys.executable, "-m", "specfleet.cli", *args], env)


def connection_data(demo) -> list[str]:
    """The demo host's address and SSH settings as pyinfra `--data` overrides (the address is
    the fleet's own, checked to be in its subnet by Fleet.ip)."""
    data = {"ssh_hostname": demo.fleet.ip(HOST), "ssh_key": str(demo.fleet.key_path),
            "ssh_strict_host_key_checking": "off", "ssh_known_hosts_file": "/dev/null"}
    return [a for k, v in data.items() for a in ("--data", f"{k}={v}")]


def test_pyinfra_dry_on_the_ct200_inventory_prints_the_launch_plan(demo, tmp_path):
    """A fresh clone on a control machine without the internet: the PR#20547 port's upstream
    text (pinned URLs on GitHub and PyPI) cannot be fetched (every URL goes through a proxy that
    refuses), nothing is cached (HOME is empty), no HF_TOKEN. The plan goes on without the port
    (it says DFLASH v1 is kept and why) and is printed; the run exits 0."""
    home = tmp_path / "home"
    home.mkdir()
    dead = "http://127.0.0.1:9"
    rc, out, err, _ = run([PYINFRA, "inventories/ct200.py", DEPLOY, "--dry",
                           *connection_data(demo)],
                          environ(token=False, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                                  https_proxy=dead, http_proxy=dead, HTTPS_PROXY=dead,
                                  HTTP_PROXY=dead, no_proxy="", NO_PROXY=""))
    text = out + err
    assert rc == 0, text[-4000:]
    assert "[ct200] plan:" in text
    assert "--speculative-algorithm DFLASH" in text and "--tp-size 8" in text
    assert "cannot fetch https://" in text
    assert "this plan keeps DFLASH v1; a real run stops here" in text
    assert "Detected changes" in text and "No hosts remaining" not in text


def test_converge_then_every_dry_says_no_change(demo):
    rc, out, err, _ = run([PYINFRA, "-y", str(demo.inventory), DEPLOY],
                          environ(SPECFLEET_ALLOW_TEST_SETTINGS="1"))
    assert rc == 0, (out + err)[-4000:]
    # Plain pyinfra: no change and no conditional one (the restart's condition is decided from
    # the facts: nothing upstream of it changes).
    rc, out, err, _ = run([PYINFRA, str(demo.inventory), DEPLOY, "--dry"])
    assert rc == 0, (out + err)[-4000:]
    table = (out + err).split("--> Detected changes:", 1)[1]
    assert "(ct200)" not in table, table
    assert "Restart for new software or weights" not in table
    assert "[ct200] plan:" in out + err
    # The rollout's dry run: the host is ok, nothing "would change".
    rc, out, err, _ = specfleet("rollout", str(demo.inventory), DEPLOY, "--dry", "--json")
    assert rc == 0, err[-4000:]
    report = json.loads(out)
    row = report["hosts"][HOST]
    assert row["status"] == "ok" and row["changed_ops"] == [] and row["conditional_ops"] == []
    assert "would change" not in out + err
    assert "--speculative-algorithm DFLASH" in row["launch_plan"]


def test_no_token_with_the_weights_present_is_said_and_goes_on(demo):
    held = "/root/.specfleet-test-tokens"
    demo.fleet.run(HOST, f"mkdir -p {held} && mv /root/.cache/huggingface/token {held}/own && "
                   f"mv /var/lib/specfleet/hf/token {held}/copy", check=True)
    try:
        rc, out, err, _ = run([PYINFRA, str(demo.inventory), DEPLOY, "--dry"],
                              environ(token=False))
    finally:
        demo.fleet.run(HOST, f"mv {held}/own /root/.cache/huggingface/token && "
                       f"mv {held}/copy /var/lib/specfleet/hf/token", check=True)
    assert rc == 0, (out + err)[-4000:]
    assert "no Hugging Face token for the gated demo/Kimi-K2.6-DFlash-mini: none needed now" in (
        out + err)
    assert "[ct200] plan:" in out + err


def test_a_host_without_systemctl_shows_the_plan_then_fails_the_dry_run(demo):
    demo.fleet.run(HOST, "mv /usr/bin/systemctl /usr/bin/systemctl.away", check=True)
    try:
        rc, out, err, _ = run([PYINFRA, str(demo.inventory), DEPLOY, "--dry"])
        rrc, rout, rerr, _ = specfleet("rollout", str(demo.inventory), DEPLOY, "--dry")
    finally:
        demo.fleet.run(HOST, "mv /usr/bin/systemctl.away /usr/bin/systemctl", check=True)
    text = out + err
    assert rc == 1, text[-4000:]
    assert text.count("[ct200] plan:") == 1
    said = "will fail: systemctl is not on this host: the SGLang server runs as a systemd unit"
    assert text.count(said) == 1, text
    assert "fix: run specfleet on a host booted with systemd" in text
    assert rrc == 1 and "[ct200] plan:" in rout + rerr
    assert f"{HOST}  canary  failed" in rout


def test_an_unreachable_host_is_listed_with_its_error_and_nothing_hangs(demo, tmp_path):
    subnet = ipaddress.ip_network(demo.fleet.subnet)
    taken = {demo.fleet.ip(h) for h in demo.fleet.hosts} | {demo.fleet.bridge_ip}
    ghost_ip = str(subnet.network_address + 250)
    assert ghost_ip not in taken
    inv = tmp_path / "with_ghost.py"
    inv.write_text(demo.inventory.read_text() + (
        f"\nall[0].append(('ghost', {{**_connect, 'ssh_hostname': {ghost_ip!r}}}))\n"))
    rc, out, err, took = specfleet("status", str(inv), "--json")
    assert rc == 1 and took < 120, err[-3000:]
    doc = json.loads(out)
    assert doc["exit_code"] == 1
    assert doc["hosts"][HOST]["verdict"] == "in sync, healthy"
    ghost = doc["hosts"]["ghost"]
    assert ghost["reachable"] is False and ghost_ip in ghost["error"]
    assert ghost["verdict"].startswith("unreachable: ")
    rc, out, err, took = specfleet("status", str(inv), "--fail-on-drift", "--limit", HOST)
    assert rc == 0, err[-3000:]
    rc, out, err, took = specfleet("logs", str(inv), "ghost", "--timeout", "10")
    assert rc == 1 and took < 60
    assert "[ghost] cannot connect" in err and "fix: check the address and SSH settings" in err
    rc, out, err, took = specfleet("probe", str(inv))
    assert rc == 1 and took < 120
    assert "ghost: unreachable: " in err + out and "ct200:" in out


def test_logs_over_pyinfra_s_connection_and_a_user_who_cannot_read_the_secrets(demo, tmp_path):
    rc, out, err, _ = specfleet("logs", str(demo.inventory), HOST, "-n", "50")
    assert rc == 0, err[-3000:]
    assert out.strip(), "the journal of a running server is not empty"
    # A user without root: the token under /root cannot be read, so the journal is refused.
    demo.fleet.run(HOST, "id viewer >/dev/null 2>&1 || useradd -m viewer; "
                   "mkdir -p ~viewer/.ssh && cp /root/.ssh/authorized_keys ~viewer/.ssh/ && "
                   "chown -R viewer: ~viewer/.ssh", check=True)
    rc, out, err, _ = specfleet("logs", str(demo.inventory), HOST, "--ssh-user", "viewer")
    assert rc == 1, err
    assert "this user cannot read /root/.cache/huggingface/token" in err
    assert "fix: run with --sudo (or connect as root: --ssh-user root)" in err
    assert out == ""


def test_bad_settings_stop_before_any_connection(demo, tmp_path):
    inv = tmp_path / "bad.py"
    inv.write_text(demo.inventory.read_text().replace("'readiness_timeout_s': 120.0",
                                                      "'readiness_timeout_s': 'soon'"))
    for command in (["status"], ["rollout", None, DEPLOY], ["logs", None, HOST]):
        argv = [str(inv) if a is None else a for a in command]
        if len(argv) == 1:
            argv.append(str(inv))
        rc, out, err, took = specfleet(*argv)
        assert rc == 3, (argv, err)
        assert "[ct200]" in err and "readiness_timeout_s" in err and "fix:" in err
        assert "No hosts remaining" not in err and took < 30
    rc, out, err, _ = run([PYINFRA, str(inv), DEPLOY, "--dry"])
    assert rc == 1 and "readiness_timeout_s" in out + err
    assert "No hosts remaining" not in out + err



# ---------------------------------------------------------------------------------------------
# The README's quickstart, line by line, on the demo host
# ---------------------------------------------------------------------------------------------


def quickstart_lines() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    block = text[text.index("<!-- quickstart -->"):text.index("<!-- /quickstart -->")]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in body.splitlines() if line.strip()]


def test_the_readme_quickstart_runs_line_by_line(demo, tmp_path):
    """Each command of the README's quickstart, as written, with what a user fills in filled in:
    the copy of first_host.py gets the demo host's address and the demo's settings (its
    stand-in hub and pinned commits, the wheelhouse, the stand-in server's launcher), the SSH
    key goes to ssh/pyinfra as data and -i, and the tunnel's local end is a free port (30000 may
    be taken on a shared machine). The install line is not run here: this test runs in the venv
    .ci/setup.sh made with that command (checked: its lines make .venv and pip install -e)."""
    import shlex
    import socket
    from pathlib import Path

    from tests.harness.core import SSH_OPTS

    lines = quickstart_lines()
    assert [shlex.split(x, comments=True)[0] for x in lines] == [
        "python3", "cp", "export", "specfleet", "specfleet", "pyinfra", "pyinfra", "ssh", "curl"]
    ip = demo.fleet.ip(HOST)
    mine = tmp_path / "my_host.py"
    env = environ(SPECFLEET_ALLOW_TEST_SETTINGS="1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    tunnel = None
    try:
        for line in lines:
            argv = shlex.split(line.replace("inventories/my_host.py", str(mine)), comments=True)
            if argv[0] == "python3":
                setup = (REPO_ROOT / ".ci" / "setup.sh").read_text()
                assert argv[:4] == ["python3", "-m", "venv", ".venv"] and "-e" in argv
                assert "python3 -m venv .venv" in setup and "pip install" in setup
                assert Path(sys.executable).parent.parent.name == ".venv"
                continue
            if argv[0] == "cp":
                assert subprocess.run(argv, cwd=REPO_ROOT).returncode == 0
                settings = demo.settings(HOST)
                text = mine.read_text().replace("<address of the GPU host>", ip)
                text += (f"\nfirst_host[0][1]['specfleet'].update({settings!r})\n"
                         f"first_host[0][1].update(ssh_key={str(demo.fleet.key_path)!r}, "
                         "ssh_strict_host_key_checking='off', ssh_known_hosts_file='/dev/null')\n")
                for repo in ("moonshotai/Kimi-K2.6", "z-lab/Kimi-K2.6-DFlash"):
                    text = text.replace(f"<40-hex commit of {repo}>", "0" * 40)
                mine.write_text(text)
                continue
            if argv[0] == "export":
                name, _ = argv[1].split("=", 1)
                env[name] = DEMO_TOKEN
                continue
            if argv[0] == "ssh":
                argv = [a.replace("30000:", f"{local}:", 1) if a.startswith("30000:") else a
                        for a in argv if a != "-f"]
                argv = [argv[0], "-i", str(demo.fleet.key_path), *SSH_OPTS, "-o",
                        "ExitOnForwardFailure=yes", *argv[1:-1], f"root@{ip}"]
                tunnel = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    with socket.socket() as s:
                        if s.connect_ex(("127.0.0.1", local)) == 0:
                            break
                    time.sleep(0.3)
                continue
            if argv[0] == "curl":
                argv = [a.replace(":30000/", f":{local}/") for a in argv]
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
                assert done.returncode == 0, done.stderr
                answer = json.loads(done.stdout)
                assert "42" in answer["choices"][0]["message"]["content"], answer
                continue
            exe = PYINFRA if argv[0] == "pyinfra" else None
            argv = [exe, *argv[1:]] if exe else [sys.executable, "-m", "specfleet.cli", *argv[1:]]
            rc, out, err, _ = run(argv, env)
            assert rc == 0, (line, out[-3000:], err[-3000:])
    finally:
        if tunnel is not None:
            tunnel.terminate()
            tunnel.wait(timeout=10)
    assert tunnel is not None


def test_a_token_without_access_to_the_gated_drafter_is_refused_before_the_target_downloads(
        demo, tmp_path):
    """The Hub's refusal of the drafter (gated, the token not let in) comes before any byte of
    a new target revision: the drafter is fetched first. The stand-in hub's log shows no GET of
    the target's new files."""
    from tests.demo import DRAFTER, TARGET
    from tests.harness.weights_support import commit_files

    # New revisions of both, so that both steps have something to fetch.
    new = {repo: commit_files(demo.workdir / "mirrors", repo, {"extra.safetensors": b"x" * 4096},
                              message="a new revision") for repo in (TARGET, DRAFTER)}
    inv = demo.write_inventory(tmp_path / "newrev.py", ct200={
        "target": {"revision": new[TARGET]}, "drafter": {"revision": new[DRAFTER]}})
    before = len(demo.hub.log_lines())
    rc, out, err, _ = run([PYINFRA, "-y", str(inv), DEPLOY],
                          environ(HF_TOKEN="hf_not_let_in_" + "1" * 20,
                                  SPECFLEET_ALLOW_TEST_SETTINGS="1"))
    text = out + err
    assert rc != 0
    assert "Drafter weights" in text and ("403" in text or "not in the authorized list" in text)
    new_gets = [line for line in demo.hub.log_lines()[before:]
                if line.startswith(f"GET /{TARGET}/resolve/")]
    assert new_gets == [], new_gets
