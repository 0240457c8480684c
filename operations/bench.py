"""The smoke benchmark of a host's own SGLang server, run on the host, and the sweep's guard.

The client is ``specfleet/hostside/bench_client.py`` (stdlib; ``sglang.bench_serving`` when the
server's venv has its dependencies). It writes its result under ``<state_dir>/bench/`` on the
host; ``smoke`` then downloads it to the control machine (``fetch_to``), where
``specfleet.fleet.bench`` makes the fleet's table and ``specfleet.fleet.sweep`` records a point.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.operations import files

from facts.cache import cached_fact
from facts.gpu import Gpus
from facts.serving import ServiceState
from facts.sglang import SGLangInstall
from operations import preflight
from operations.server_facts import service_state_args
from operations.util import fails_host
from operations.venvs import effective_settings
from specfleet.core.errors import SpecfleetError
from specfleet.core.layout import bench_dir, join, serve_path, server_paths, sglang_python
from specfleet.core.resources import hostside_path
from specfleet.core.settings import Settings
from specfleet.core.sglang.install import venv_python
from specfleet.core.tables import ddtree_designs
from specfleet.core.unit import has_api_key

CLIENT = "bench_client.py"
# The check of who listens on the port, beside the client (it sends the key only to the unit).
PORT_OWNER = "port_owner.py"


def server_url(settings: Settings) -> str:
    """Where the host reaches its own server: loopback when it listens on every address."""
    addr = settings.listen_host
    if addr in ("0.0.0.0", ""):
        addr = "127.0.0.1"
    elif addr == "::":
        addr = "::1"
    if ":" in addr:
        addr = f"[{addr}]"
    return f"http://{addr}:{settings.port}"


def host_arch() -> str:
    """``sm90``-style name of the host's GPUs (``?`` without a readable nvidia-smi)."""
    gpus = (host.get_fact(Gpus) or {}).get("gpus") or []
    sms = sorted({g.get("sm") for g in gpus if g.get("sm")})
    return f"sm{sms[0]}" if len(sms) == 1 else ("mixed" if sms else "?")


def client_argv(settings: Settings, out: str, concurrency: Sequence[int], requests: int,
                max_tokens: int, meta: dict[str, str], keep_previous: bool) -> list[str]:
    s = settings
    argv = [s.python, join(bench_dir(s), CLIENT), "--url", server_url(s),
            "--concurrency", ",".join(str(c) for c in concurrency),
            "--requests", str(requests), "--max-tokens", str(max_tokens), "--out", out,
            "--sglang-python", sglang_python(s),
            "--tokenizer", serve_path(s, "target")]
    if has_api_key(s):
        argv += ["--api-key-file", server_paths(s).secret, "--unit", server_paths(s).unit_name]
    if not keep_previous:
        argv.append("--no-previous")
    for key, value in sorted(meta.items()):
        argv += ["--meta", f"{key}={value}"]
    return argv


@operation(is_idempotent=False, idempotent_notice="A benchmark: it always runs.")
@fails_host
def smoke(
    settings: Settings,
    concurrency: Sequence[int] = (1, 4),
    requests: int = 0,
    max_tokens: int = 64,
    result: str = "latest",
    fetch_to: str | None = None,
):
    """
    Benchmark the host's own SGLang server from the host: a short, bounded load.

    + settings: the deploy's ``Settings``
    + concurrency: the concurrency levels, each ``requests`` streaming completions
    + requests: requests per level (0: twice the concurrency)
    + max_tokens: output tokens per request
    + result: the result's name under ``<state_dir>/bench/`` (``latest`` keeps the one before
      it as ``previous.json``, for the rollout's speed gate; other names keep no history)
    + fetch_to: a folder on the control machine to download the result to, as ``<host>.json``
    """
    s = settings
    if not concurrency or any(int(c) < 1 for c in concurrency):
        raise SpecfleetError(f"bench concurrency {list(concurrency)!r} needs levels >= 1",
                             host=host.name, fix="pass levels such as 1,4")
    folder = bench_dir(s)
    out = join(folder, f"{result}.json")
    yield from files.directory._inner(path=folder, mode="0700")
    for program in (CLIENT, PORT_OWNER):
        yield from files.put._inner(src=str(hostside_path(program)), dest=join(folder, program),
                                    mode="0644")
    # ``launcher`` is the test-only way to start the stand-in server: its numbers say so.
    meta = {"arch": host_arch(), "service": s.service_name,
            "server": "stand-in" if s.launcher else "sglang"}
    argv = client_argv(s, out, [int(c) for c in concurrency], requests, max_tokens, meta,
                       keep_previous=result == "latest")
    yield StringCommand(" ".join(shlex.quote(a) for a in argv))
    if fetch_to:
        yield from files.get._inner(src=out, dest=posixpath.join(fetch_to, f"{host.name}.json"),
                                    add_deploy_dir=False, create_local_dir=True, force=True)


@operation()
@fails_host
def not_serving(settings: Settings, allow: bool = False):
    """
    Fail the host when its SGLang unit is up (serving), unless ``allow``: a sweep restarts the
    server once per grid point, which drops every request in flight.

    + settings: the deploy's ``Settings``
    + allow: let a serving host be swept (``specfleet sweep --allow-serving``)
    """
    s = settings
    st = host.get_fact(ServiceState, **service_state_args(s)) or {}
    unit = server_paths(s).unit_name
    if st.get("active_state") not in ("active", "activating", "reloading"):
        host.noop(f"{unit} is not serving")
        return
    if allow:
        host.noop(f"{unit} is serving; sweeping it anyway, as allowed")
        return
    raise SpecfleetError(
        f"{unit} is serving ({st.get('active_state')}): a sweep restarts it once per grid "
        "point and drops the requests in flight",
        host=host.name,
        fix="take the host out of service first, or pass --allow-serving",
    )
    yield  # unreached: it makes this a generator, as pyinfra runs operation bodies


@operation()
@fails_host
def ddtree_available(settings: Settings):
    """
    Fail the host, before anything changes, when its installed SGLang has no DDTree design the
    table knows: a sweep over DDTree budgets there would measure plain DFlash at every point.

    + settings: the deploy's ``Settings``
    """
    s = effective_settings(settings)
    install = cached_fact(host, SGLangInstall, python=venv_python(s.venv)) or {}
    found = install.get("ddtree")
    design = ddtree_designs.design_named((found or {}).get("design"))
    if design is not None:
        host.noop(f"SGLang {install.get('version')} has {ddtree_designs.describe(found)}")
        return
    what = ddtree_designs.describe(found) if install else "no SGLang installed"
    raise SpecfleetError(
        f"a DDTree budget axis cannot be swept here: the SGLang in {s.venv} has {what}",
        host=host.name,
        fix="install an SGLang build with DDTree (sglang.kind 'source', e.g. the DDTree fork) "
        "and deploy it first, or sweep without --ddtree-budgets",
    )
    yield  # unreached: it makes this a generator, as pyinfra runs operation bodies


def locked_smoke(settings: Settings, options: Mapping[str, Any] | None, result: str) -> None:
    """The smoke benchmark under the run lock, with ``options`` as the ``specfleet_bench`` host
    data gives them (``concurrency``, ``requests``, ``max_tokens``, ``result``, ``fetch_to``):
    what ``deploys/bench_kimi.py`` and ``deploys/sweep_point.py`` run. Call it from a deploy."""
    opts = dict(options or {})
    preflight.lock(name="Hold the run lock", settings=settings, probe=False)
    smoke(
        name="Smoke benchmark",
        settings=effective_settings(settings),
        concurrency=opts.get("concurrency", (1, 4)),
        requests=int(opts.get("requests", 0)),
        max_tokens=int(opts.get("max_tokens", 64)),
        result=str(opts.get("result", result)),
        fetch_to=opts.get("fetch_to"),
    )
    preflight.lock(name="Release the run lock", settings=settings, present=False)
