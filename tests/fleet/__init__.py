"""Tests on real hosts (marked ``fleet``: they need root), and ``python -m tests.fleet``, the
fleet CLI. The harness itself is ``tests.harness``: import ``Fleet``, ``HostSpec`` from there."""
