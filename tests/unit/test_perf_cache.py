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
from facts.hf import Token
from facts.serving import ServiceState


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


@pytest.mark.local
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


@pytest.mark.local
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


@pytest.mark.local
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


@pytest.mark.local
def test_no_probe_means_live_facts(run, tmp_path):
    value = tmp_path / "value"
    value.write_text("x\n")
    state = run()
    add_op(state, ask, path=str(value))
    add_op(state, ask, path=str(value))
    run_ops(state)
    assert SEEN == ["x", "x"] and runs(value) == 2


@pytest.mark.local
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
    assert fact_key(Token, {}) == fact_key(Token, {"path": None})
    assert fact_key(Value, {"path": "/p"}).startswith(f"{Value.name}#")
    assert " " not in fact_key(ServiceState, {"service": "a b.service"})


@pytest.mark.local
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


@pytest.mark.local
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
    from operations.probe import deploy_specs
    from specfleet.core.settings import settings_from_dict

    s = settings_from_dict({
        "target": {"repo_id": "demo/Kimi-K2.6-mini", "revision": "a" * 40},
        "drafter": {"repo_id": "demo/Kimi-K2.6-DFlash-mini", "revision": "b" * 40, "gated": True},
        "sglang": {"version": "0.5.11"},
    }, host="h1")
    specs = deploy_specs(s, "/var/lib/specfleet/run.lock")
    assert len(cache.keyed_specs(specs)) == len({fact_key(c, k) for c, k in specs}) >= 20


class Script(FactBase):
    """A test fact that is one Python script of ``python3 -I -S``: prints, writes to stderr,
    exits or raises as ``what`` says."""

    SOURCES = {
        "print": "import sys; print(repr({'argv': sys.argv[1:], 'n': 1}))",
        "exit3": "import sys; print('partial'); print('why', file=sys.stderr); sys.exit(3)",
        "raise": "import sys; sys.path.append('/polluted'); raise RuntimeError('boom')",
        "path": "import sys; print('/polluted' in sys.path)",
    }

    def python_job(self, what: str, arg: str = "a b"):
        from facts.hostpy import PythonJob

        return PythonJob("python3", ("-I", "-S"), self.SOURCES[what], (arg,))

    def command(self, what: str, arg: str = "a b"):
        return StringCommand(*self.python_job(what, arg).words())

    def process(self, output):
        return output


@pytest.mark.local
def test_python_facts_of_one_interpreter_run_in_one_process_as_they_would_alone(tmp_path):
    """Each script's stdout, stderr (a traceback too) and exit status through the runner are
    those of its own `python -c`; the SGLang venv facts (here this venv's python) share one
    process, the weights state scripts another; a missing interpreter falls back to each
    fact's own command."""
    import subprocess
    import sys

    from facts.hostpy import RUNNER
    from facts.python import Packages
    from facts.sglang import SGLangInstall, Venv
    from facts.weights import WeightsState

    models = tmp_path / "models"
    (models / ("c" * 40)).mkdir(parents=True)
    (models / "current").symlink_to("c" * 40)
    specs = [
        (SGLangInstall, {"python": sys.executable}),
        (Packages, {"python": sys.executable, "names": ["pyinfra", "no-such-dist"]}),
        (Venv, {"path": sys.prefix}),
        (WeightsState, {"path": str(models)}),
        (WeightsState, {"path": str(tmp_path / "absent")}),
        (Script, {"what": "print"}),
        (Script, {"what": "exit3"}),
        (Script, {"what": "raise"}),
        (Script, {"what": "path"}),
        (SGLangInstall, {"python": "/no/such/python"}),
        (Packages, {"python": "/no/such/python"}),
    ]
    grouped = cache.command(specs, parallel=True)
    # One runner for the venv's three facts, one for python3's six; the missing interpreter's
    # pair has a runner too, whose fallback is what runs.
    assert grouped.count(RUNNER.replace("'", "'\"'\"'")[:60]) == 3

    def run_probe(command):
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        return done.stdout.splitlines()

    alone, together = run_probe(cache.command(specs, parallel=False)), run_probe(grouped)
    assert cache.parse(specs, together) == cache.parse(specs, alone)
    sections_alone = cache.split_probe_output(alone)
    sections_together = cache.split_probe_output(together)
    assert sections_together == sections_alone
    value = cache.parse(specs, together)["facts"]
    key = fact_key
    assert value[key(Packages, {"python": sys.executable, "names": ["pyinfra", "no-such-dist"]})][
        "pyinfra"]
    assert value[key(Venv, {"path": sys.prefix})] == {"python": sys.version.split()[0]}
    assert value[key(WeightsState, {"path": str(models)})]["current"] == "c" * 40
    assert value[key(Script, {"what": "print"})] == [repr({"argv": ["a b"], "n": 1})]
    assert value[key(Script, {"what": "path"})] == ["False"]  # sys.path was put back
    exit3 = sections_together[key(Script, {"what": "exit3"})]
    assert (exit3["rc"], exit3["stdout"], exit3["stderr"]) == (3, ["partial"], ["why"])
    raised = sections_together[key(Script, {"what": "raise"})]
    assert raised["rc"] == 1 and raised["stderr"][-1] == "RuntimeError: boom"


# --------------------------------------------------------------------------------------------------
# Memos of a converged run's pure work (bench/converged/profile.md): keyed on exactly what they
# are given, each caller gets its own value, and errors are never remembered
# --------------------------------------------------------------------------------------------------


def test_fact_key_memo_is_the_computed_key_and_bad_arguments_still_fail():
    assert fact_key(Value, {"path": "/x"}) == cache._fact_key(Value, {"path": "/x"})
    # defaults filled in: asking with the default spelled out is the same fact
    assert fact_key(Value, {"path": "/x"}) == fact_key(Value, {"path": "/x", "tag": "a"})
    assert fact_key(Value, {"path": "/x"}) != fact_key(Value, {"path": "/y"})
    for _ in range(2):
        with pytest.raises(TypeError):
            fact_key(Value, {"nope": 1})


def test_printed_literals_are_parsed_once_and_each_caller_gets_its_own():
    from facts.hostpy import parse_printed

    text = "{'dists': {'sglang': '0.5.11'}, 'paths': ['/a', '/b']}"
    first = parse_printed(text)
    first["dists"]["sglang"] = "changed by a caller"
    first["paths"].append("/c")
    assert parse_printed(text) == {"dists": {"sglang": "0.5.11"}, "paths": ["/a", "/b"]}
    assert parse_printed('{"json": true}') == {"json": True}
    for _ in range(2):
        with pytest.raises((ValueError, SyntaxError)):
            parse_printed("{'unterminated': ")


def test_settings_are_built_once_per_data_and_refused_every_time():
    from specfleet.core.errors import SettingsError
    from specfleet.core.settings import settings_from_layers

    layers = [{"port": 30001}, {"models_root": "/srv/m"}]
    a = settings_from_layers(layers, host="h1")
    assert settings_from_layers([{"port": 30001}, {"models_root": "/srv/m"}], host="h1") is a
    assert (a.port, a.models_root) == (30001, "/srv/m")
    other = settings_from_layers([{"port": 30002}], host="h1")
    assert other.port == 30002 and other is not a
    for _ in range(2):
        with pytest.raises(SettingsError, match="port"):
            settings_from_layers([{"port": -1}], host="h1")
