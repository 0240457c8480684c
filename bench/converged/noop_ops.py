"""A reference deploy for bench/converged: stock pyinfra running as many operations per host as
a converged ``deploys/kimi_k26.py`` on a host that serves alone (15), each doing nothing (a
``host.noop``) and asking no fact: what pyinfra itself needs for that many operations, without
specfleet's code or its pyinfra speedups (nothing of the project is imported)."""

from pyinfra import host
from pyinfra.api import operation

OPERATIONS = 15


@operation()
def nothing(step: int = 0):
    host.noop(f"step {step}: nothing to do")
    yield from ()


for step in range(OPERATIONS):
    nothing(name=f"No-op step {step + 1}", step=step)
