"""specfleet's idempotent operations (pyinfra ``@operation``s), paired with ``facts/`` by name."""

from operations import pyinfra_speedups

pyinfra_speedups.install()
