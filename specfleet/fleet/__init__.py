"""The top floor: fleet controllers (rollout, fan-out). They import only specfleet.core and
pyinfra, and run deploy files by path, in this process, on pyinfra's Python API.

pyinfra runs hosts in gevent greenlets; its CLI monkey-patches the standard library first so that
SSH (paramiko's sockets and threads) yields between them. The controllers drive the same API in
their own process, so the process that runs them patches it first, before anything imports
``ssl`` or ``paramiko`` (``specfleet.cli``'s fleet subcommands, ``gevent_patched``; the test
harness, ``tests/conftest.py``): else one host's command would block every other host, the run
locks' heartbeats, and every timeout. Importing this package patches nothing.
"""
