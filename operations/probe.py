"""The deploy's one probe per host: every fact `deploys/kimi_k26.py` asks on a converged host.

``preflight.lock`` takes it (with the run lock, in the same command) and ``facts.cache`` keeps it
for the run: the operations ask through ``cached_fact``/``cached_gather`` and get these values
while nothing on the host has changed. The arguments here must be exactly those the operations
pass; a fact missing here (or asked with other arguments) is simply asked live, one SSH command
more, which ``bench/converged`` shows as ``commands_per_host``.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from pyinfra.facts.files import File, Sha256File

from facts.preflight import RunLock
from facts.probe import default_specs
from facts.python import Packages
from facts.serving import ServiceState
from facts.sglang import PatchState, SGLangInstall, Venv
from facts.weights import WeightsJob, WeightsState, WeightsTools
from operations.serving import host_specs, server_paths, service_state_args, unit_files
from operations.venvs import candidate_venvs
from operations.watchdog import state_args as watchdog_state_args
from operations.weights import TOOLS_PATH, control_token_path, model_root, unit_pattern
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import venv_python


def deploy_specs(s: Settings, lock_path: str) -> list[tuple[Any, dict[str, Any]]]:
    """``[(fact, kwargs)]`` for ``facts.cache``: each step's facts, in deploy order."""
    specs: list[tuple[Any, dict[str, Any]]] = [(RunLock, {"path": lock_path})]
    # preflight.checks
    specs += default_specs(
        python=posixpath.join(s.venv, "bin", "python"), models_path=s.models_root,
        token_path=s.weights.host_token_path,
    ).values()
    specs.append((ServiceState, service_state_args(s)))
    for src in (s.target, s.drafter):
        specs.append((WeightsState, {"path": posixpath.join(s.models_root, src.dir_name)}))
    # sglang.installed, compressed_tensors, pr20547: in the configured venv, and in the one beside
    # it for this release (operations.venvs picks)
    for venv in candidate_venvs(s):
        vpy = venv_python(venv)
        specs += [
            (Venv, {"path": venv}),
            (Packages, {"python": vpy}),
            (PatchState, {"venv": venv}),
            (SGLangInstall, {"python": vpy}),
        ]
    # weights.tools_from_settings, host_token, model (target, drafter)
    token = control_token_path(s)
    specs += [(WeightsTools, {"path": TOOLS_PATH}), (File, {"path": token}),
              (Sha256File, {"path": token})]
    work = f"{s.state_dir.rstrip('/')}/weights"
    for which in ("target", "drafter"):
        root = model_root(s, which).rstrip("/")
        specs.append((WeightsState, {"path": root}))
        specs.append((WeightsJob, {
            "pattern": unit_pattern(root),
            "progress_path": f"{work}/{os.path.basename(root)}.progress.json",
        }))
    # server.unit, server.service
    paths = server_paths(s)
    specs += host_specs(s, unit_files(paths)).values()
    # watchdog.service, watchdog.deploy_record
    specs.append((ServiceState, watchdog_state_args(s)))
    return specs
