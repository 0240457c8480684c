"""facts.cache: the run's probe answers facts only while nothing on the host has changed.

Real pyinfra runs (API mode, ``@local``): a fact that counts its own executions in a file shows
how many commands really ran; the operations are small generators like the deploy's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api import Config, FactBase, Inventory, State, StringCommand, operation
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_host, ctx_state

from facts import cache
from facts.cache import cached_fact, cached_gather, fact_key


class Value(FactBase):
    """The content of ``path``; every run of the command appends a line to ``path.count``."""

    def command(self, path: str, tag: str = "a"):
        return StringCommand("echo", tag, ">>", f"{path}.count", ";", "cat", path)

    def process(self, output):
        return "\n".join(output)


class Broken(FactBase):
    def command(self, path: str):
        return StringCommand("echo", "x", ">>", f"{path}.count", ";", "exit", "3")


def runs(path: Path) -> int:
    count = Path(f"{path}.count")
    return len(count.read_text().splitlines()) if count.exists() else 0


SEEN: list = []


@operation()
def take_probe(specs: list):
    from pyinfra import host

    cache.load(host, specs)
    host.noop("probe taken")
    yield from ()


@operation()
def ask(path: str, tag: str = "a"):
    from pyinfra import host

    SEEN.append(cached_fact(host, Value, path=path, tag=tag))
    host.noop("asked")
    yield from ()


@operation()
def write(path: str, text: str):
    yield StringCommand("echo", text, ">", path)


@pytest.fixture
def run(tmp_path):
    SEEN.clear()
    states = []

    def make(check_for_changes: bool = False):
        inventory = Inventory((["@local"], {}))
        state = State(inventory=inventory, config=Config(), check_for_changes=check_for_changes)
        connect_all(state)
        states.append(state)
        return state

    yield make
    for state in states:
        disconnect_all(state)


def test_probe_answers_until_the_host_changes(run, tmp_path):
    value = tmp_path / "value"
    value.write_text("one\n")
    state = run()
    specs = [(Value, {"path": str(value)})]
    add_op(state, take_probe, specs=specs)
    add_op(state, ask, path=str(value))
    add_op(state, ask, path=str(value))
    add_op(state, write, path=str(value), text="two")
    add_op(state, ask, path=str(value))
    run_ops(state)
    # The probe ran the fact once, both asks before the change were answered from it, and the
    # ask after the change ran the fact again and saw the new value.
    assert SEEN == ["one", "one", "two"]
    assert runs(value) == 2


def test_other_arguments_and_failed_facts_are_asked_live(run, tmp_path):
    value = tmp_path / "value"
    value.write_text("v\n")
    broken = tmp_path / "broken"
    state = run()
    add_op(state, take_probe, specs=[(Value, {"path": str(value)}), (Broken, {"path": str(broken)})])
    add_op(state, ask, path=str(value), tag="b")
    run_ops(state)
    assert SEEN == ["v"]
    assert runs(value) == 2  # the probe (tag a), then live for tag b
    host = state.inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(host):
        assert cache.cached_value(host, Broken, {"path": str(broken)}) == (False, None)


def test_a_probe_taken_while_preparing_is_not_used_executing(run, tmp_path):
    value = tmp_path / "value"
    value.write_text("before\n")
    state = run(check_for_changes=True)
    specs = [(Value, {"path": str(value)})]
    add_op(state, take_probe, specs=specs)  # prepare: the probe runs here
    add_op(state, ask, path=str(value))  # prepare: answered from it
    assert SEEN == ["before"] and runs(value) == 1
    value.write_text("after\n")
    SEEN.clear()
    run_ops(state)  # execute: a fresh probe
    assert SEEN == ["after"]
    assert runs(value) == 2


def test_no_probe_means_live_facts(run, tmp_path):
    value = tmp_path / "value"
    value.write_text("x\n")
    state = run()
    add_op(state, ask, path=str(value))
    add_op(state, ask, path=str(value))
    run_ops(state)
    assert SEEN == ["x", "x"] and runs(value) == 2


def test_gather_from_the_probe_and_live_for_what_it_lacks(run, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A\n")
    b.write_text("B\n")
    state = run()
    host = state.inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(host):
        cache.load(host, [(Value, {"path": str(a)})])
        got = cached_gather(host, {"x": (Value, {"path": str(a)}), "y": (Value, {"path": str(b)})})
    assert got == {"x": "A", "y": "B"}
    assert runs(a) == 1 and runs(b) == 1


def test_fact_key_fills_defaults_and_names_the_fact():
    assert fact_key(Value, {"path": "/p"}) == fact_key(Value, {"path": "/p", "tag": "a"})
    assert fact_key(Value, {"path": "/p"}) != fact_key(Value, {"path": "/p", "tag": "b"})
    assert fact_key("facts.hf.Token", {}) == fact_key("facts.hf.Token", {"path": None})
    assert fact_key(Value, {"path": "/p"}).startswith(f"{Value.name}#")
    assert " " not in fact_key("facts.server.ServiceState", {"service": "a b.service"})


def test_pyinfra_hash_facts_parse_with_their_arguments(run, tmp_path):
    import hashlib

    from pyinfra.facts.files import File, Sha256File

    token = tmp_path / "token"
    token.write_text("secret\n")
    state = run()
    host = state.inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(host):
        cache.load(host, [(Sha256File, {"path": str(token)}), (File, {"path": str(token)})])
        assert cache.cached_value(host, Sha256File, {"path": str(token)}) == (
            True, hashlib.sha256(b"secret\n").hexdigest())
        hit, info = cache.cached_value(host, File, {"path": str(token)})
        assert hit and info["size"] == 7


def test_parallel_probe_reads_what_the_sequential_one_reads(tmp_path):
    import subprocess

    from pyinfra.facts.files import File, Sha256File

    from facts.probe import MISSING

    class Missing(FactBase):
        def command(self):
            return "echo should-not-run"

        def requires_command(self, *args, **kwargs):
            return "specfleet-no-such-binary"

    value = tmp_path / "value"
    value.write_text("v1\nv2\n")
    specs = [
        (Value, {"path": str(value)}),
        (Broken, {"path": str(tmp_path / "broken")}),
        (Sha256File, {"path": str(value)}),
        (File, {"path": str(tmp_path / "absent")}),
        (Missing, {}),
    ]

    def run_probe(parallel):
        done = subprocess.run(["sh", "-c", cache.command(specs, parallel=parallel)],
                              capture_output=True, text=True, check=True)
        assert MISSING in done.stdout
        return cache.parse(specs, done.stdout.splitlines())

    sequential, parallel = run_probe(False), run_probe(True)
    assert parallel == sequential
    assert parallel["facts"][fact_key(Value, {"path": str(value)})] == "v1\nv2"
    assert list(parallel["errors"]) == [fact_key(Broken, {"path": str(tmp_path / "broken")})]
    assert parallel["facts"][fact_key(File, {"path": str(tmp_path / "absent")})] is None


def test_a_spec_that_does_not_fit_its_fact_is_left_out(tmp_path):
    value = tmp_path / "value"
    value.write_text("v\n")
    keyed = cache.keyed_specs([(Value, {"path": str(value)}), (Value, {"no_such_arg": 1}),
                               ("facts.no_such.Fact", {})])
    assert list(keyed) == [fact_key(Value, {"path": str(value)})]


def test_the_deploy_probe_builds_for_the_demo_settings():
    """operations.probe.deploy_specs against the facts as they are now: every spec binds to its
    fact (a renamed argument would silently cost one SSH command per host)."""
    from deploys.settings import settings_from_dict
    from operations.probe import deploy_specs

    s = settings_from_dict({
        "target": {"repo_id": "demo/Kimi-K2.6-mini", "revision": "a" * 40},
        "drafter": {"repo_id": "demo/Kimi-K2.6-DFlash-mini", "revision": "b" * 40, "gated": True},
        "sglang": {"version": "0.5.11"},
    }, host="h1")
    specs = deploy_specs(s, "/var/lib/specfleet/run.lock")
    assert len(cache.keyed_specs(specs)) == len({fact_key(c, k) for c, k in specs}) >= 20
