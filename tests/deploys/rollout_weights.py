"""The weights-only deploy of the rollout tests' prefetch stage (like deploys/weights_only.py)."""

from pyinfra import host

from operations import weights
from specfleet.core.settings import settings_for_host

settings = settings_for_host(host)

weights.tools_from_settings(settings)
weights.token_from_settings(settings)
weights.model(name="Target weights", settings=settings, which="target")
weights.model(name="Drafter weights", settings=settings, which="drafter")
