"""The Kimi K2.6 + DFlash deploy as a pyinfra ``@deploy`` function (pyinfra's packaged-deploy
convention), composed from this folder's operations. ``deploys/kimi_k26.py`` calls it; a deploy
file of your own can too::

    from operations.kimi_k26 import kimi_k26
    settings = settings_in_play()  # operations.util: None for a host with bad settings
    if settings is not None:
        kimi_k26(settings=settings)

``present=False`` (the ``present: False`` setting, ``specfleet remove``) takes it off instead:
under the run lock, ``operations.removal`` removes what ``removal.footprint`` lists. Otherwise:

1. preflight (with a per-host run lock), before anything changes;
2. SGLang pinned, compressed-tensors pinned, PR#20547 where missing;
3. the target and drafter weights, pinned and verified;
4. the launch plan and the systemd unit;
5. restart only on change (a serving group restarts as one), then the readiness gate (on a
   serving group's rank 0: SGLang's ranks >= 1 answer health checks whatever their state);
6. the health watchdog (with the /metrics relay) and the deploy's record for the metrics.
"""

from pyinfra import host
from pyinfra.api import deploy

from operations import preflight, removal, serving, sglang, watchdog, weights
from operations.util import changed_if, fail_planned_host
from operations.venvs import effective_settings
from specfleet.core.settings import Settings


@deploy("Kimi K2.6")
def kimi_k26(settings: Settings, present: bool | None = None,
             remove_weights: bool | None = None, remove_venv: bool | None = None) -> None:
    """The deploy on this host; ``present`` (default: ``settings.present``) False removes it,
    keeping the weights and a venv of the user's own unless ``remove_weights``/``remove_venv``
    (default: ``settings.removal``)."""
    if not (settings.present if present is None else present):
        preflight.lock(name="Hold the run lock", settings=settings, probe=False)
        removal.removed(name="Specfleet's deploy removed", settings=settings,
                        weights=remove_weights, venv=remove_venv)
        preflight.lock(name="Release the run lock", settings=settings, present=False)
        return
    preflight.lock(name="Hold the run lock", settings=settings)
    # The venv this run uses: the configured one, or one beside it for another release.
    settings = effective_settings(settings)
    preflight.checks(name="Preflight", settings=settings)

    software = sglang.ensure_software(settings)

    weights.tools_from_settings(settings)
    weights.token_from_settings(settings)
    # The drafter first: it is small and gated, so a token without access to it is refused by the
    # Hub (its 403, quoted) before the target's ~595 GB download, not after it.
    drafter = weights.model(name=f"Drafter weights {settings.drafter.repo_id}",
                            settings=settings, which="drafter")
    target = weights.model(name=f"Target weights {settings.target.repo_id}",
                           settings=settings, which="target")

    serving.unit(name="SGLang unit from the launch plan", settings=settings)
    restart_if = changed_if("the software or weights", *software.values(), target, drafter)
    if restart_if is not None:  # None: the facts say none of them changes, so no restart
        serving.restart_pending(
            name="Restart for new software or weights",
            settings=settings,
            reason="the software or weights",
            _if=restart_if,
        )
    if settings.group is not None:
        serving.group_restart(name="Serving group restarts as one", settings=settings)
    serving.service(
        name="SGLang server running, enabled and ready",
        settings=settings,
        running=True,
        enabled=True,
        ready=settings.group is None or settings.group.members[0] == host.name,
    )
    watchdog.service(name="Health watchdog and metrics relay", settings=settings)
    watchdog.deploy_record(name="Deploy record for the metrics", settings=settings)

    preflight.lock(name="Release the run lock", settings=settings, present=False)
    fail_planned_host()  # --dry: a plan that would fail exits 1, after the whole report
