"""specfleet: idempotent pyinfra provisioning of SGLang speculative-decoding servers.

Floors, top to bottom (imports only go down; ``tests/unit/test_floors.py`` guards it):

- ``specfleet.fleet`` and ``specfleet.cli``: the rollout and fan-out controllers and the
  ``specfleet`` console script. They import only ``specfleet.core`` and pyinfra, and run deploy
  files by path, as pyinfra's own CLI does.
- ``deploys/``: only files passed to ``pyinfra``.
- ``operations/``: pyinfra operations and the ``@deploy`` functions.
- ``facts/``: pyinfra facts and their pure parsers.
- ``specfleet.core``: pure (no pyinfra state, no I/O): settings, tables, plan, preflight.

``specfleet.hostside`` stands apart: stdlib-only programs shipped to hosts, importing nothing of
the project. Any floor may read them (as files to upload, or import their pure helpers).
"""
