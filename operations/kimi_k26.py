"""The Kimi K2.6 + DFlash deploy as a pyinfra ``@deploy`` function (pyinfra's packaged-deploy
convention), composed from this folder's operations. ``deploys/kimi_k26.py`` calls it; a deploy
file of your own can too::

    from operations.kimi_k26 import kimi_k26
    kimi_k26(settings=settings_for_all_hosts(inventory)[host.name])

1. preflight (with a per-host run lock), before anything changes;
2. SGLang pinned, compressed-tensors pinned, PR#20547 where missing;
3. the target and drafter weights, pinned and verified;
4. the launch plan and the systemd unit;
5. restart only on change, then the readiness gate;
6. the health watchdog (with the /metrics relay) and the deploy's record for the metrics.
"""

from pyinfra.api import deploy
from pyinfra.operations.util import any_changed

from operations import preflight, serving, sglang, watchdog, weights
from operations.venvs import effective_settings
from specfleet.core.settings import Settings


@deploy("Kimi K2.6")
def kimi_k26(settings: Settings) -> None:
    preflight.lock(name="Hold the run lock", settings=settings)
    # The venv this run uses: the configured one, or one beside it for another release.
    settings = effective_settings(settings)
    preflight.checks(name="Preflight", settings=settings)

    software = sglang.ensure_software(settings)

    weights.tools_from_settings(name="Weights tools")
    weights.token_from_settings(name="Hugging Face token")
    target = weights.model(name=f"Target weights {settings.target.repo_id}", which="target")
    drafter = weights.model(name=f"Drafter weights {settings.drafter.repo_id}", which="drafter")

    serving.unit(name="SGLang unit from the launch plan", settings=settings)
    serving.restart_pending(
        name="Restart for new software or weights",
        settings=settings,
        reason="the software or weights",
        _if=any_changed(*software.values(), target, drafter),
    )
    serving.service(
        name="SGLang server running, enabled and ready",
        settings=settings,
        running=True,
        enabled=True,
        ready=True,
    )
    watchdog.service(name="Health watchdog and metrics relay", settings=settings)
    watchdog.deploy_record(name="Deploy record for the metrics", settings=settings)

    preflight.lock(name="Release the run lock", settings=settings, present=False)
