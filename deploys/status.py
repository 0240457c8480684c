"""What each host is running, read-only: the Monday-morning view of a fleet.

    pyinfra INVENTORY deploys/status.py [--limit HOST]
    specfleet status INVENTORY [--limit HOST] --json    (one JSON document on stdout)

Per host: the SGLang version and PR#20547 state, each model's revision and manifest state, the
unit's hash against the one the launch plan would render now, health (``/health_generate``
and ``/get_model_info`` probed from the host), and the run lock (free, or its holder, since
when, and when its lease expires). It takes no lock itself. A table at the end gives each
host's verdict: "in sync, healthy", or "drift: ..." naming what a ``deploys/kimi_k26.py`` run
would change.
It changes nothing: every host reports "No changes".
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
from operations import status
from operations.pyinfra_speedups import install as install_speedups

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_in_play()
if settings is not None:
    status.report(name="Status (read-only)", settings=settings)
