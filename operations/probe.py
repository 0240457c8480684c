"""The deploy's one probe per host: every fact `deploys/kimi_k26.py` asks on a converged host.

``preflight.lock`` takes it (with the run lock, in the same command) and ``facts.cache`` keeps it
for the run: the operations ask through ``cached_fact``/``cached_gather`` and get these values
while nothing on the host has changed. The arguments here must be exactly those the operations
pass; a fact missing here (or asked with other arguments) is simply asked live, one SSH command
more, which ``bench/converged`` shows as ``commands_per_host``.
"""

from __future__ import annotations

from typing import Any

from pyinfra.facts.files import File, Sha256File

from facts.preflight import RunLock, WritableByOthers
from facts.probe import default_specs
from facts.python import Packages
from facts.serving import ServiceState, UnitFiles
from facts.sglang import PatchState, RopePatchState, SGLangInstall, SourceTreeKey, Venv
from facts.weights import WeightsJob, WeightsState, WeightsTools
from operations.server_facts import (
    host_specs,
    service_state_args,
    trust_args,
    unit_files_args,
)
from operations.venvs import candidate_venvs
from operations.watchdog import state_args as watchdog_state_args
from operations.weights import unit_pattern
from specfleet.core.layout import (
    TOOLS_PATH,
    control_token_path,
    model_root,
    server_paths,
    sglang_python,
    venv_python,
    weights_job_paths,
)
from specfleet.core.settings import Settings


def deploy_specs(s: Settings, lock_path: str) -> list[tuple[Any, dict[str, Any]]]:
    """``[(fact, kwargs)]`` for ``facts.cache``: each step's facts, in deploy order."""
    specs: list[tuple[Any, dict[str, Any]]] = [(RunLock, {"path": lock_path})]
    # preflight.checks
    specs += default_specs(
        python=sglang_python(s), models_path=s.models_root,
        token_path=s.weights.host_token_path,
    ).values()
    specs.append((ServiceState, service_state_args(s)))
    specs.append((UnitFiles, unit_files_args(s)))
    specs.append((WritableByOthers, trust_args(s)))
    for which in ("target", "drafter"):
        specs.append((WeightsState, {"path": model_root(s, which)}))
    # sglang.installed, compressed_tensors, pr20547, dflash_rope: in the configured venv, and in
    # the one beside it for this release (operations.venvs picks)
    for venv in candidate_venvs(s):
        vpy = venv_python(venv)
        specs += [
            (Venv, {"path": venv}),
            (Packages, {"python": vpy}),
            (PatchState, {"venv": venv}),
            (RopePatchState, {"venv": venv}),
            (SGLangInstall, {"python": vpy}),
        ]
        if s.sglang.kind == "source" and s.sglang.source_path:
            # The tree's content against what the venv recorded (sglang.installed's key).
            specs.append((SourceTreeKey, {"path": s.sglang.source_path, "venv": venv}))
    # weights.tools_from_settings, host_token, model (target, drafter)
    token = control_token_path(s)
    specs += [(WeightsTools, {"path": TOOLS_PATH}), (File, {"path": token}),
              (Sha256File, {"path": token})]
    for which in ("target", "drafter"):
        root = model_root(s, which).rstrip("/")
        specs.append((WeightsState, {"path": root}))
        specs.append((WeightsJob, {
            "pattern": unit_pattern(root),
            "progress_path": weights_job_paths(s.state_dir, root).progress,
        }))
    # serving.unit, serving.service
    paths = server_paths(s)
    specs += host_specs(s, paths.unit_files()).values()
    # watchdog.service, watchdog.deploy_record
    specs.append((ServiceState, watchdog_state_args(s)))
    return specs
