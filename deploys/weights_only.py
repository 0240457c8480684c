"""Only the weights of deploys/kimi_k26.py: the rollout's prefetch stage without fan-out.

    specfleet rollout INVENTORY deploys/kimi_k26.py --no-fanout

downloads the target and drafter to every host first (each from upstream), so that no batch
waits on a 595 GB download with its server down. Nothing else on the host changes.
"""

try:
    from operations.util import settings_in_play
except ModuleNotFoundError as exc:  # pyinfra puts the current directory on sys.path, not this one
    if exc.name != "operations":
        raise
    raise SystemExit(
        f"specfleet: {__file__} needs the checkout's operations/ and facts/, which pyinfra finds "
        "in the current directory only\n  fix: cd "
        f"{__import__('pathlib').Path(__file__).resolve().parents[1]} and run pyinfra from there"
    ) from None
from operations import preflight, weights
from operations.pyinfra_speedups import install as install_speedups

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_in_play()
if settings is not None:
    preflight.lock(name="Hold the run lock", settings=settings)
    weights.tools_from_settings(settings)
    weights.token_from_settings(settings)
    weights.model(name=f"Target weights {settings.target.repo_id}",
                  settings=settings, which="target")
    weights.model(name=f"Drafter weights {settings.drafter.repo_id}",
                  settings=settings, which="drafter")
    preflight.lock(name="Release the run lock", settings=settings, present=False)
