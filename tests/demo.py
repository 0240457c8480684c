"""The local demo fleet: `deploys/kimi_k26.py` end to end on real Debian hosts.

    python -m tests.demo [up|run|down]      (`.ci/demo` runs it: the README's demo command)

What is real: the hosts (systemd-nspawn, sshd, systemd), pyinfra over SSH, SGLang 0.5.11 wheels
from PyPI (installed --no-deps: no torch here), huggingface_hub downloading through a hub on the
fleet bridge, systemd units, the readiness gate. What stands in, and why:
- `nvidia-smi` replays real captures of each machine type (there is no GPU here);
- the hub is `tests/harness/standin_hub.py`, serving small git repos shaped like Kimi K2.6 and its
  gated DFlash drafter (no route to the Hub here);
- the SGLang server is `tests/harness/standin_sglang_server.py`, started through the test-only
  `launcher` setting with the plan's exact flags (the real one needs GPUs and torch), by the
  host's SGLang venv's interpreter, so it reads the tree the deploy installed.

Two more 8x H100 hosts, h100a and h100b, form the serving group kimi-h100-pair: one server, tensor
parallel over their 16 GPUs (rank 0 on h100a serves the API).

The CT200-like host mirrors CT200: 8x RTX PRO 6000 (SM120, PCIe), an existing venv at
/root/venv_sglang211 with SGLang 0.5.11 reused in place, a token already at huggingface_hub's
default path, and 593 GiB of free space faked with a tmpfs. It opts in to PR#20547 as
inventories/ct200.py does (patch.sha256): the deploy builds this project's port onto 0.5.11 from
its recipe, taking the upstream text from ../shared/fixtures/sglang-pr20547/ (the PR head) and
the wheelhouse (the 0.5.11 and 0.5.14 wheels) as patch.source mirrors, each file checked against
its sha256. Without that folder the demo says so and CT200 keeps DFLASH v1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import Fleet, HostSpec
from tests.harness.core import fleet_tag
from tests.harness.port_build import port_settings, write_stale_mask_recipe
from tests.harness.sources import PR20547_TARBALL
from tests.harness.weights_support import StandinHub, make_repo, random_bytes

REPO_ROOT = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")
DEPLOY = "deploys/kimi_k26.py"
STANDIN = "/opt/specfleet-standin/standin_sglang_server.py"
# The stand-in server's performance model, imported from beside it (/v1/completions, speeds).
STANDIN_PERF = "/opt/specfleet-standin/standin_perf.py"
STANDIN_RULES = "/opt/specfleet-standin/sglang_rules.py"
# Where the stand-in writes what it was started with and what SGLang's rules said of it.
STANDIN_RECORD = "/run/standin.json"
TARGET = "demo/Kimi-K2.6-mini"
DRAFTER = "demo/Kimi-K2.6-DFlash-mini"
# The demo's HF token: a throwaway value the stand-in hub accepts for the gated drafter.
DEMO_TOKEN = "hf_demo_" + "0" * 24
# The demo's settings use test-only keys (launcher, sglang.no_deps): every run that loads them sets
# this in its environment, or the settings are refused.
TEST_ENV = {"SPECFLEET_ALLOW_TEST_SETTINGS": "1"}

HOSTS = [
    HostSpec("ct200", gpu="rtx6000x8", disk="593G"),
    HostSpec("b200", gpu="b200x8", disk="64G"),
    # No single 8x H100 host: Kimi K2.6 is 70.1 GiB of weights per GPU at TP 8 and SGLang leaves
    # about 56-60 GiB per H100 80GB for weights and KV cache (its own memory rule; issue 30), so
    # `specfleet plan` refuses one. Two of them serve it as a group (35 GiB of weights per GPU).
    # A serving group: two 8x H100 hosts running one server as TP 16.
    HostSpec("h100a", gpu="h100x8", disk="64G"),
    HostSpec("h100b", gpu="h100x8", disk="64G"),
]
# The demo's serving group, declared once (every member reads the same section).
GROUP = {"name": "kimi-h100-pair", "members": ["h100a", "h100b"]}


def target_files() -> dict[str, bytes]:
    """A scaled-down Kimi K2.6: its config shape and two safetensors shards of a few MiB."""
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2"},
        "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"},
    }
    return {
        "config.json": json.dumps(config, indent=1).encode(),
        "model-00001-of-00002.safetensors": random_bytes(3 << 20, "t1"),
        "model-00002-of-00002.safetensors": random_bytes(2 << 20, "t2"),
        "model.safetensors.index.json": b'{"weight_map": {}}',
    }


def drafter_files() -> dict[str, bytes]:
    config = {"architectures": ["DFlashDraftModel"], "block_size": 8,
              "dflash_config": {"block_size": 8, "mask_token_id": 163838}}
    return {"config.json": json.dumps(config, indent=1).encode(),
            "model.safetensors": random_bytes(1 << 20, "d1")}


# The CT200-like host's own venv (it is reused in place, as on CT200).
CT200_VENV = "/root/venv_sglang211"


def stale_mask_port(workdir: Path) -> dict:
    """The CT200-like host's settings over-ride that gives it the broken verify tree: the port
    less its verify-mask fix (0.5.11 + triton + CUDA graphs: a stale mask), through the test-only
    ``patch.test_recipe``. The recipe is made now by tests.harness.port_build from the shipped
    one (it names upstream text, holds none); the text still comes from the shared fixtures."""
    recipe = write_stale_mask_recipe(workdir / "stale-mask-recipe.json")
    return {"patch": {**port_settings(), "test_recipe": str(recipe)}}


def host_venv(host: str) -> str:
    """The host's SGLang venv: CT200's own, else the deploy's default."""
    return CT200_VENV if host == "ct200" else "/opt/specfleet/sglang"


def standin_python(host: str) -> str:
    """The interpreter of the host's SGLang venv, as the real server's ``VENV/bin/python -m
    sglang.launch_server``: the stand-in then sees the SGLang tree the deploy installed (and
    decides from it, e.g. a stale verify mask)."""
    return f"{host_venv(host)}/bin/python"


def standin_record(fleet: Fleet, host: str, path: str = STANDIN_RECORD) -> dict:
    """The stand-in's --standin-record on a host: its argv, env, pid and ``sglang_rules``."""
    return json.loads(fleet.run(host, f"cat {path}", check=True).stdout)


@dataclass
class Demo:
    fleet: Fleet
    hub: StandinHub
    workdir: Path
    revisions: dict[str, str]
    inventory: Path = field(default=None)  # type: ignore[assignment]
    # The stand-in server runs from the host's SGLang venv (``standin_python``), as the real
    # server does, so it decides from the installed tree (a stale verify mask: wrong answers;
    # the fixed port, issue 29, answers right). Off: /usr/bin/python3, which sees no SGLang tree.
    standin_in_venv: bool = True

    def settings(self, host: str, **over) -> dict:
        data = {
            "target": {"repo_id": TARGET, "revision": self.revisions[TARGET]},
            "drafter": {"repo_id": DRAFTER, "revision": self.revisions[DRAFTER], "gated": True},
            "sglang": {
                "version": "0.5.11", "find_links": self.fleet.wheelhouse_url,
                "trusted_hosts": [self.fleet.bridge_ip], "no_deps": True,
            },
            # The stand-in hub serves plain http on the fleet's bridge: allowed by name.
            "weights": {"hf_endpoint": self.hub.url, "poll_seconds": 0.5,
                        "allow_http_hosts": [urllib.parse.urlsplit(self.hub.url).hostname]},
            "readiness_timeout_s": 120.0,
            "launcher": [standin_python(host) if self.standin_in_venv else "/usr/bin/python3",
                         STANDIN, "--standin-record", STANDIN_RECORD],
        }
        if host in GROUP["members"]:
            data["group"] = dict(GROUP)
        if host == "ct200":
            data.update(venv=CT200_VENV, models_root="/srv/models")
            if PR20547_TARBALL.is_file():
                # As inventories/ct200.py (opted in by the pin), the sources from local mirrors.
                data["patch"] = port_settings()
        for key, value in over.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return data

    def write_inventory(self, path: Path | None = None, **per_host_over) -> Path:
        path = path or self.workdir / "demo_inventory.py"
        host_data = {
            h: {"specfleet": self.settings(h, **per_host_over.get(h, {}))}
            for h in self.fleet.hosts
        }
        self.fleet.write_inventory(path, host_data=host_data)
        if path == self.workdir / "demo_inventory.py":
            self.inventory = path
        return path

    def pyinfra(self, *args: str, inventory: Path | None = None, token: bool = True,
                timeout: float = 900, capture: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(TEST_ENV)
        if token:
            env["HF_TOKEN"] = DEMO_TOKEN
        argv = [PYINFRA, *args, str(inventory or self.inventory), DEPLOY]
        return subprocess.run(argv, cwd=REPO_ROOT, env=env, timeout=timeout,
                              capture_output=capture, text=True)

    def down(self) -> None:
        self.hub.stop()
        self.fleet.down()


def prepare_hosts(fleet: Fleet) -> None:
    """What the demo hosts have before specfleet touches them (as CT200 does)."""
    pip = " ".join(fleet.pip_args())
    for name in fleet.hosts:
        fleet.run(name, "mkdir -p /opt/specfleet-standin", check=True)
        fleet.put(name, REPO_ROOT / "tests" / "harness" / "standin_sglang_server.py", STANDIN)
        fleet.put(name, REPO_ROOT / "tests" / "harness" / "standin_perf.py", STANDIN_PERF)
        # SGLang's own rules on the installed tree (the stand-in refuses what SGLang refuses).
        fleet.put(name, REPO_ROOT / "tests" / "harness" / "sglang_rules.py", STANDIN_RULES)
        fleet.put(name, REPO_ROOT / "tests" / "harness" / "releases.py",
                  "/opt/specfleet-standin/releases.py")
    if "ct200" in fleet.hosts:
        fleet.run(
            "ct200",
            "python3 -m venv /root/venv_sglang211 && /root/venv_sglang211/bin/pip install -q "
            f"--disable-pip-version-check --no-deps {pip} sglang==0.5.11 && "
            "mkdir -p /root/.cache/huggingface && umask 077 && "
            f"printf %s {DEMO_TOKEN} > /root/.cache/huggingface/token",
            check=True,
            timeout=600,
        )


def serve(fleet: Fleet, workdir: Path, standin_in_venv: bool = True) -> Demo:
    """The demo on a booted fleet: the stand-in hub serving the demo's repositories (the drafter
    gated on ``DEMO_TOKEN``) and the hosts prepared. The caller stops ``demo.hub``; a step that
    fails stops it here, as no caller holds it yet."""
    mirrors = workdir / "mirrors"
    revisions = {TARGET: make_repo(mirrors, TARGET, target_files()),
                 DRAFTER: make_repo(mirrors, DRAFTER, drafter_files())}
    hub = StandinHub(mirrors, fleet.bridge_ip, workdir)
    try:
        token_hash = hashlib.sha256(DEMO_TOKEN.encode()).hexdigest()
        hub.configure(gated={DRAFTER: [token_hash]})
        hub.wait(TARGET)
        prepare_hosts(fleet)
    except BaseException:
        hub.stop()
        raise
    return Demo(fleet, hub, workdir, revisions, standin_in_venv=standin_in_venv)


def demo_name() -> str:
    """``demo``, or ``demo-TAG`` under SPECFLEET_FLEET_TAG=TAG: ``Fleet.up`` tears down an older
    fleet of the same name, so a tagged demo (a helper's, CI's) must not take down another one."""
    tag = fleet_tag()
    return f"demo-{tag}" if tag else "demo"


def up(name: str | None = None, hosts: list[HostSpec] | None = None,
       workdir: Path | None = None, standin_in_venv: bool = True,
       owner_pid: int | None = None) -> Demo:
    name = name or demo_name()
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"specfleet-{name}-"))
    fleet = Fleet.up(name, hosts or HOSTS, owner_pid=owner_pid)
    demo = serve(fleet, workdir, standin_in_venv=standin_in_venv)
    demo.write_inventory()
    return demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the fleet running afterwards")
    args = parser.parse_args(argv)
    print("==> booting the demo fleet (4 Debian hosts: CT200-like 8x RTX PRO 6000, 8x B200, "
          "and two 8x H100 serving one server as the group kimi-h100-pair) and the "
          "stand-in hub", flush=True)
    demo = up()
    try:
        print(f"==> inventory: {demo.inventory}", flush=True)
        if not PR20547_TARBALL.is_file():
            print(f"==> {PR20547_TARBALL} is not here: ct200 keeps DFLASH v1 (no PR#20547 port)",
                  flush=True)
        print("==> pyinfra --dry: what would change, and the launch plan each host would get",
              flush=True)
        demo.pyinfra("--dry", capture=False)
        print("==> pyinfra -y: the deploy", flush=True)
        first = demo.pyinfra("-y", capture=False)
        print("==> pyinfra -y again: a converged fleet changes nothing", flush=True)
        second = demo.pyinfra("-y", capture=False)
        for name in demo.fleet.hosts:
            if name in GROUP["members"][1:]:
                print(f"    {name}: rank {GROUP['members'].index(name)} of {GROUP['name']} "
                      f"(served by {GROUP['members'][0]})")
                continue
            res = demo.fleet.run(name, "curl -s http://127.0.0.1:30000/get_model_info")
            print(f"    {name}: /get_model_info -> {res.stdout.strip()}")
        return 0 if first.returncode == 0 and second.returncode == 0 else 1
    finally:
        if args.keep:
            print(f"==> left running: python -m tests.fleet ssh --name {demo.fleet.name} ct200, "
                  f"then python -m tests.fleet down --name {demo.fleet.name}")
        else:
            demo.down()


if __name__ == "__main__":
    sys.exit(main())
