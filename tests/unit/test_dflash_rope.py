"""Issue #52 item 6: the DFlash drafter's RoPE on SGLang 0.5.11, before and after the drafter RoPE
patch (``specfleet/patchdata/dflash_rope/sglang-0.5.11/recipe.json``).

The drafter's config is read as SGLang reads it, by transformers' ``AutoConfig`` (5.6, the
release 0.5.11 pins); the rotary settings are then computed by the ``DFlashAttention.__init__``
statements of 0.5.11's ``models/dflash.py`` and of the patched file, with ``get_rope`` (the
rotary kernel's factory) replaced by a recorder of what it is given and 0.5.11's own
``get_rope_config``.
"""

from __future__ import annotations

import ast
import json
import types
import zipfile
from pathlib import Path

import pytest
import transformers

from specfleet.core.sglang.rope import (
    ROPE_APPLIED,
    ROPE_APPLY,
    ROPE_NOOP,
    ROPE_RESTORE,
    ROPE_TARGET,
    decide_dflash_rope,
    load_rope_patch,
    rope_patch_id,
)
from tests.harness.port_build import build_dflash_rope, recipe_reader
from tests.harness.sources import sglang_wheel
from tests.unit.test_pr20547_fixes import method

COMMON = "sglang/srt/utils/hf_transformers/common.py"
TARGET, APPLY, APPLIED, NOOP, RESTORE = ROPE_TARGET, ROPE_APPLY, ROPE_APPLIED, ROPE_NOOP, ROPE_RESTORE
patch_id = rope_patch_id
# A DFlash drafter's config.json as z-lab publishes them (a Qwen3-architecture drafter with a
# dflash_config), with z-lab/Kimi-K2.6-DFlash's RoPE: base 50000, yarn.
DRAFTER_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "rope_theta": 50000.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 64.0,
                     "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                     "beta_slow": 1.0},
    "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 999},
    "block_size": 8,
}  # fmt: skip


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    folder = tmp_path_factory.mktemp("drafter")
    (folder / "config.json").write_text(json.dumps(DRAFTER_CONFIG))
    return transformers.AutoConfig.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def wheel_0511() -> zipfile.ZipFile:
    return zipfile.ZipFile(sglang_wheel("0.5.11"))


def rope_of(dflash_text: str, wheel: zipfile.ZipFile, config, tmp_path: Path) -> dict:
    """What the drafter's attention hands ``get_rope``: the ``DFlashAttention.__init__``
    statements from the first RoPE read to ``self.rotary_emb = get_rope(...)``, run on
    ``config``."""
    common = tmp_path / "common.py"
    common.write_bytes(wheel.read(COMMON))
    get_rope_config = method(common, None, "get_rope_config", {})
    tree = ast.parse(dflash_text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DFlashAttention")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    texts = [ast.unparse(s) for s in init.body]
    first = next(i for i, t in enumerate(texts) if "rope_theta" in t)
    last = next(i for i, t in enumerate(texts) if t.startswith("self.rotary_emb = get_rope("))
    given: dict = {}

    def get_rope(head_size, **kwargs):
        given.update(kwargs)
        return "rotary"

    scope = {"config": config, "head_dim": 64, "self": types.SimpleNamespace(),
             "get_rope": get_rope, "get_rope_config": get_rope_config}  # fmt: skip
    code = compile(ast.Module(body=init.body[first : last + 1], type_ignores=[]), "dflash", "exec")
    exec(code, scope)
    return given


def test_transformers_keeps_the_drafters_rope_only_in_rope_parameters(config):
    # What 0.5.11's getattr(config, "rope_theta", 1000000) misses.
    assert transformers.__version__ == "5.6.0"
    assert config.rope_parameters["rope_theta"] == 50000.0
    assert config.rope_parameters["rope_type"] == "yarn"
    assert getattr(config, "rope_theta", None) is None


@pytest.mark.local
def test_the_drafter_uses_its_rope_after_the_patch_and_base_1e6_before(config, wheel_0511,
                                                                       tmp_path):  # fmt: skip
    before = rope_of(wheel_0511.read(TARGET).decode(), wheel_0511, config, tmp_path)
    # Every DFlash drafter on 0.5.11 runs at base 1e6 whatever its config says; its scaling
    # still arrives, through transformers 5's rope_scaling alias of rope_parameters (get_rope
    # takes the base from its argument, not from that dict).
    assert before["base"] == 1000000.0
    assert before["rope_scaling"]["rope_type"] == "yarn"
    after = rope_of(build_dflash_rope()[TARGET], wheel_0511, config, tmp_path)
    assert after["base"] == 50000.0
    assert after["rope_scaling"]["rope_type"] == "yarn"
    assert after["rope_scaling"]["factor"] == 64.0
    assert after["max_position"] == before["max_position"] == 262144


@pytest.mark.local
def test_the_patch_is_0511s_file_with_0514s_two_lines():
    patch = load_rope_patch("0.5.11")
    diff, _ = patch.build(recipe_reader(patch.recipe))
    assert [f.path for f in diff.files] == [TARGET]
    added = [ln[1:].strip() for ln in diff.text.splitlines() if ln.startswith("+") and
             not ln.startswith("+++")]  # fmt: skip
    removed = [ln[1:].strip() for ln in diff.text.splitlines() if ln.startswith("-") and
               not ln.startswith("---")]  # fmt: skip
    assert added == ["from sglang.srt.utils.hf_transformers_utils import get_rope_config",
                     "rope_theta, rope_scaling = get_rope_config(config)"]  # fmt: skip
    assert removed == ['rope_theta = float(getattr(config, "rope_theta", 1000000))',
                       'rope_scaling = getattr(config, "rope_scaling", None)']  # fmt: skip
    assert load_rope_patch("0.5.14") is None


@pytest.mark.local
def test_the_decision_applies_only_to_the_wheels_own_file_and_is_reversible():
    patch = load_rope_patch("0.5.11")
    diff, _ = patch.build(recipe_reader(patch.recipe))
    pid = patch_id(patch)
    pristine = patch.release_sha256
    d = decide_dflash_rope("0.5.11", pristine, None, present=True, patch=patch, wanted_id=pid)
    assert (d.steps, d.row) == (("apply",), APPLY)
    d = decide_dflash_rope("0.5.11", "0" * 64, None, present=True, patch=patch, wanted_id=pid)
    assert d.noop and d.row == NOOP and "is not the 0.5.11 wheel's" in d.reason
    applied = {"sha256": pid, "intact": True}
    d = decide_dflash_rope("0.5.11", "x", applied, present=True, patch=patch, wanted_id=pid)
    assert d.noop and d.row == APPLIED
    d = decide_dflash_rope("0.5.11", "x", applied, present=False, patch=patch, wanted_id=pid)
    assert (d.steps, d.row) == (("restore",), RESTORE)
    d = decide_dflash_rope("0.5.11", "x", {"sha256": "1" * 64, "intact": True}, present=True,
                           patch=patch, wanted_id=pid)  # fmt: skip
    assert d.steps == ("restore", "apply")
    # pip replaced the file under the marker: forget it, then judge the file as it is.
    d = decide_dflash_rope("0.5.11", pristine, {"sha256": pid, "intact": False}, present=True,
                           patch=patch, wanted_id=pid)  # fmt: skip
    assert d.steps == ("forget", "apply") and "no longer matches" in d.warning
    d = decide_dflash_rope("0.5.11", "x", {"partial": True}, present=True, patch=patch,
                           wanted_id=pid)  # fmt: skip
    assert d.steps == ("restore", "apply")
    d = decide_dflash_rope("0.5.14", "x", None, present=True, patch=None, wanted_id=None)
    assert d.noop and "needs no drafter RoPE patch" in d.reason


@pytest.mark.local
def test_the_patch_applies_to_the_wheels_file_and_restores_it_byte_for_byte(wheel_0511, tmp_path):
    """The deploy's own scripts (PR#20547's journaled apply and restore) on the 0.5.11 wheel's
    file with real GNU patch, and the PatchState fact on the patch's own state folder."""
    from facts.sglang import PatchState, RopePatchState
    from operations.sglang_commands import apply_script, restore_script
    from specfleet.core.layout import rope_state_dir
    from tests.unit.test_op_sglang_unit import sh

    venv = tmp_path / "venv"
    site = venv / "lib/python3.11/site-packages"
    (site / TARGET).parent.mkdir(parents=True)
    original = wheel_0511.read(TARGET)
    (site / TARGET).write_bytes(original)
    patch = load_rope_patch("0.5.11")
    diff, want = patch.build(recipe_reader(patch.recipe))
    d = Path(rope_state_dir(str(venv)))
    d.mkdir(parents=True)
    (d / "applied.diff").write_text(diff.text)
    r = sh(apply_script(str(d), str(site), diff))
    assert r.returncode == 0 and not (d / "conflict").exists(), r.stdout + r.stderr
    assert (site / TARGET).read_text() == build_dflash_rope()[TARGET]
    import hashlib
    assert hashlib.sha256((site / TARGET).read_bytes()).hexdigest() == want
    (d / "sha256").write_text(patch_id(patch) + "\n")
    fact = RopePatchState()
    state = fact.process(sh(fact.command(str(venv))).stdout.splitlines())
    assert state["sha256"] == patch_id(patch) and state["intact"] is True
    # The PR#20547 marker's folder is another: this patch is not taken for the port.
    port = PatchState()
    assert port.process(sh(port.command(str(venv))).stdout.splitlines()) is None
    r = sh(restore_script(str(d)))
    assert r.returncode == 0, r.stderr
    assert (site / TARGET).read_bytes() == original and not d.exists()


def test_an_unreachable_source_is_tried_once_a_run_and_a_build_once_a_process(monkeypatch):
    """operations.sglang._rope_built: a converged 32-host run with no route to PyPI tried the
    wheels once per host (21 ms of control CPU each); now once per run, each host still told."""
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra_testing.util import FakeState, create_host

    from operations import sglang as op
    from operations.sglang_sources import UpstreamUnreachable

    warnings = []
    monkeypatch.setattr(op.logger, "warning", warnings.append)
    tries = []

    class Patch:
        recipe = {"test": "unreachable", "n": 1}
        sources = {}

        def build(self, reader):
            tries.append(reader.host)
            raise UpstreamUnreachable("cannot fetch https://pypi.example/x.whl", host=reader.host,
                                      fix="set patch.source")

    def built_on(state, names):
        out = []
        for name in names:
            h = create_host(state, name)
            with ctx_state.use(state), ctx_host.use(h):
                out.append(op._rope_built(Patch(), None))
        return out

    run1 = FakeState()
    assert built_on(run1, ["a", "b", "c"]) == [None, None, None]
    assert tries == ["a"] and len(warnings) == 3 and all("left out" in w for w in warnings)
    assert built_on(FakeState(), ["a"]) == [None] and tries == ["a", "a"]  # the next run retries

    class Good(Patch):
        recipe = {"test": "reachable", "n": 2}

        def build(self, reader):
            tries.append(reader.host)
            return ("diff", "sha")

    for name in ("a", "b"):
        run = FakeState()
        h = create_host(run, name)
        with ctx_state.use(run), ctx_host.use(h):
            assert op._rope_built(Good(), ["/mirror"]) == ("diff", "sha")
    assert tries == ["a", "a", "a"]  # built once for the process


def test_hosts_that_reach_the_build_together_fetch_once(monkeypatch):
    """pyinfra runs each host's operation in its own greenlet: 8 hosts reached the fetch before
    any had finished it, so each fetched (the converged bench: +0.025 CPU-s per host)."""
    import gevent
    from pyinfra.context import ctx_host, ctx_state
    from pyinfra_testing.util import FakeState, create_host

    from operations import sglang as op
    from operations.sglang_sources import UpstreamUnreachable

    monkeypatch.setattr(op.logger, "warning", lambda msg: None)
    tries = []

    class Patch:
        recipe = {"test": "together"}
        sources = {}

        def build(self, reader):
            tries.append(reader.host)
            gevent.sleep(0.05)  # the fetch waits on the network: the other greenlets run
            raise UpstreamUnreachable("cannot fetch x", host=reader.host, fix="set patch.source")

    run = FakeState()

    def one(name):
        with ctx_state.use(run), ctx_host.use(create_host(run, name)):
            return op._rope_built(Patch(), None)

    jobs = [gevent.spawn(one, f"h{i}") for i in range(8)]
    gevent.joinall(jobs, raise_error=True)
    assert [j.value for j in jobs] == [None] * 8 and len(tries) == 1
