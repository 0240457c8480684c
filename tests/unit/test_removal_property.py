"""Removal touches nothing outside what the deploy created (issue 55, finding 1): a hypothesis
property over generated settings, with removal's real command generation run in print mode.

The host is a folder world built under ``tmp_path``: what a deploy of service A writes there (the
paths come from ``specfleet.core.layout``, where the deploy reads them), the host's own files and
units, a second service B whose name starts with A's, and the user's files beside specfleet's. The
``Leftovers`` fact's real shell command runs against that folder (its paths prefixed with it);
systemd's answer to its unit patterns is the one stand-in: systemctl matches unit names with
fnmatch (``systemctl list-units PATTERN``), and so does ``_units`` here. ``removal.removed``
then yields its commands, which are printed, never run, and every path an ``rm`` would delete and
every unit a ``systemctl`` would act on must be A's.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeHost, FakeState, get_command_string

from facts.removal import Leftovers, parse_leftovers
from facts.sglang import PatchState, RopePatchState
from operations import removal
from operations.fanout import control_dir, pull_unit, serve_unit
from operations.weights import run_unit
from specfleet.core import layout
from specfleet.core.errors import SettingsError
from specfleet.core.settings import Settings, settings_from_dict

# What every Debian host has, and a user's own things: none of it is specfleet's.
HOST_FILES = (
    "/usr/bin/python3", "/var/lib/apt/lists/x", "/var/lib/dpkg/status", "/etc/ssh/sshd_config",
    "/etc/systemd/system/multi-user.target.wants/ssh.service", "/opt/other/app/run",
    "/srv/data/notes.txt", "/root/.bashrc", "/home/user/work.txt", "/run/sshd.pid",
)
HOST_UNITS = ("ssh.service", "sshd.service", "systemd-journald.service", "cron.service",
              "dbus.service", "nvidia-persistenced.service")


def _a_settings(name: str, state_dir: str, venv: str, models: str,
                **more: object) -> Settings | None:
    try:
        return settings_from_dict({"service_name": name, "state_dir": state_dir, "venv": venv,
                                   "models_root": models, **more})
    except SettingsError:
        return None  # refused when loaded: nothing to remove with


def deploy_writes(s: Settings, created_venv: bool) -> tuple[set[str], set[str]]:
    """The files and units a deploy of ``s`` leaves on a host, from the layout it writes by."""
    server = layout.server_paths(s)
    wd = layout.watchdog_paths(s)
    files = {*server.unit_files(), server.marker, *wd.files(), wd.program,
             layout.tools_python(), layout.control_token_path(s),
             layout.join(layout.rollback_paths(s).directory, "unit"),
             layout.join(layout.rollback_paths(s).wheels, "sglang-0.5.14-py3-none-any.whl"),
             layout.join(layout.bench_dir(s), "latest.json"),
             layout.join(layout.fanout_dir(s.state_dir), "x.pull.json")}
    roots = [layout.model_root(s, w) for w in ("target", "drafter")]
    for r in roots:
        job = layout.weights_job_paths(s.state_dir, r)
        files |= {job.job, job.progress, layout.join(r, "current", "config.json")}
        files.add(layout.join(control_dir(os.path.basename(r)), "ctl"))
    files.add(layout.join(server.cache_root, "triton", "k"))
    marker = layout.created_marker(s.venv) if created_venv else layout.patch_state_dir(s.venv)
    files |= {layout.join(s.venv, "pyvenv.cfg"), layout.join(marker, "sha256")}
    units = {server.unit_name, wd.unit_name, serve_unit("r1"),
             *(run_unit(r) for r in roots),
             *(pull_unit(os.path.basename(r), "r1") + ".service" for r in roots)}
    return files, units


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _build(root: Path, files: set[str]) -> None:
    for f in files:
        p = root / f.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists():
            p.write_text("x")


def _leftovers(root: Path, world_units: set[str], **kw):
    """The real ``Leftovers`` command on the folder world; the units matched as systemctl does."""
    r = str(root)
    cmd = Leftovers().command(paths=[r + p for p in kw["paths"]], units=[],
                              dirs=[r + p for p in kw["dirs"]],
                              venvs=[r + p for p in kw["venvs"]])
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    lines = [line.replace(r, "", 1) for line in out.splitlines()]
    value = parse_leftovers(lines)
    value["units"] = {u: {"active": "active", "enabled": "enabled"} for u in sorted(world_units)
                      if any(fnmatch.fnmatchcase(u, pat) for pat in kw["units"])}
    return value


class _World(FakeHost):
    def __init__(self, root: Path, units: set[str]):
        super().__init__(FakeState(), "h", facts={}, data={})
        self.root, self.units = root, units

    def get_fact(self, fact_cls, *args, **kwargs):
        if fact_cls is Leftovers:
            return _leftovers(self.root, self.units, **kwargs)
        if fact_cls in (PatchState, RopePatchState):  # no patch applied in this world
            return fact_cls.default()
        raise KeyError(fact_cls)

    def log(self, *args, **kwargs):
        pass


def removal_commands(s: Settings, root: Path, units: set[str], weights: bool,
                     venv: bool) -> list[list[str]]:
    """``removal.removed``'s commands for this world, printed (as argv words), never run."""
    host = _World(root, units)
    state = FakeState()
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(removal.removed._inner(s, weights=weights, venv=venv))
    return [shlex.split(get_command_string(c)) for c in commands]


# Settings a user may give, and a few hostile ones the loader must refuse (they then have no
# removal to check; tests/unit/test_settings_paths.py checks each refusal).
NAMES = st.sampled_from(["specfleet-sglang", "kimi", "sglang-a", "specfleet", "ssh", "systemd"])
STATE = st.sampled_from(["/var/lib/specfleet", "/srv/data", "/var/lib/kimi",
                         "/opt/specfleet/state", "/var/lib"])
VENV = st.sampled_from(["/opt/specfleet/sglang", "/root/venv", "/srv/venvs/sg", "/usr"])
MODELS = st.sampled_from(["/srv/models", "/opt/specfleet/models", "/data/models", "/opt"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, state_dir=STATE, venv=VENV, models=MODELS, weights=st.booleans(),
       remove_venv=st.booleans(), created=st.booleans(), n=st.integers(0, 10**9))
@pytest.mark.local
def test_removal_touches_only_what_the_deploy_created(tmp_path, name, state_dir, venv, models,
                                                      weights, remove_venv, created, n):
    s = _a_settings(name, state_dir, venv, models)
    if s is None:
        return  # the loader refused these settings: no removal can run with them
    # B: its own models (a download unit is named by the model's folder, B's are its own).
    other = _a_settings(name + "-b", state_dir, "/srv/venvs/b", "/data/b-models",
                        target={"local_dir": "b-target"}, drafter={"local_dir": "b-drafter"})
    assert other is not None
    root = tmp_path / str(n)
    mine, my_units = deploy_writes(s, created)
    theirs, their_units = deploy_writes(other, True)
    # The user's own things under A's folders: no deploy wrote them.
    users = {layout.join(state_dir, "notes.txt"), layout.join(models, "my-model", "w.bin")}
    _build(root, mine | theirs | set(HOST_FILES) | users)
    # Shared by the host's specfleet services, and A's by that right: the tools and state.
    shared = {layout.TOOLS_PATH, layout.control_token_path(s), layout.rollback_paths(s).wheels,
              layout.bench_dir(s), layout.fanout_dir(state_dir),
              layout.weights_job_paths(state_dir, "/x").work}
    commands = removal_commands(s, root, my_units | their_units | set(HOST_UNITS),
                                weights, remove_venv)
    keep = {f for f in (theirs | set(HOST_FILES) | users)
            if not any(_under(f, x) for x in shared)}
    if not weights:
        keep |= {f for f in mine if any(_under(f, w) for w in removal.footprint(s).weights)}
    for argv in commands:
        if argv[:2] == ["rm", "-rf"] or argv[:2] == ["rm", "-f"]:
            for target in argv[2:]:
                hit = sorted(f for f in keep if _under(f, target))
                assert not hit, f"removal would delete {target}, holding {hit[:3]} (not A's)"
                assert any(_under(f, target) or _under(target, f) for f in mine | shared), target
        if argv[:1] == ["systemctl"] and argv[1] in ("stop", "disable", "reset-failed"):
            for unit in argv[2:]:
                assert unit in my_units, f"removal would {argv[1]} {unit} (not A's)"
        if argv[:1] == ["sh"]:
            # a patch restore inside A's venv: it acts on that venv alone
            assert s.venv in " ".join(argv), argv
    # and what A's deploy made is gone (but the weights and a user's venv, unless asked)
    removed = {t for a in commands if a[:2] in (["rm", "-rf"], ["rm", "-f"]) for t in a[2:]}
    server = layout.server_paths(s)
    for f in (*server.unit_files(), layout.watchdog_paths(s).unit):
        assert any(_under(f, t) for t in removed), f"{f} is left"
