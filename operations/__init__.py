"""specfleet's idempotent operations (pyinfra ``@operation``s), paired with ``facts/`` by name.

Importing them changes nothing in the process: pyinfra's speedups (``pyinfra_speedups``) are
installed by the deploy files that run operations (``deploys/*.py``), with their version guard.
"""
