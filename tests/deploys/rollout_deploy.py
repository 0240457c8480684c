"""The deploy the rollout tests roll out: a stand-in for deploys/kimi_k26.py with its steps in its
order (SGLang software, weights, the unit, restart on change, readiness), on the stand-in server
(settings.launcher) since no GPU exists here."""

from pyinfra import host
from pyinfra.operations.util import any_changed

from operations import serving, weights
from operations.sglang import ensure_software
from operations.venvs import effective_settings
from specfleet.core.settings import settings_for_host

settings = effective_settings(settings_for_host(host))  # the venv, once (operations.venvs)
software = ensure_software(settings)
weights.tools_from_settings(settings)
weights.token_from_settings(settings)
target = weights.model(name="Target weights", settings=settings, which="target")
drafter = weights.model(name="Drafter weights", settings=settings, which="drafter")
serving.unit(name="SGLang unit", settings=settings)
serving.restart_pending(
    name="Restart for new software or weights",
    reason="the software or weights",
    settings=settings,
    _if=any_changed(*software.values(), target, drafter),
)
serving.service(name="SGLang server", settings=settings, running=True, enabled=True)
