"""Issue #29: what the PR#20547 port on SGLang 0.5.11 decides, run from SGLang's own files.

Each check executes the code of the patched 0.5.11 modules (and of the 0.5.11 files they meet:
the CUDA-graph runner, the triton backend, the penalty library), with only the torch-level
imports stubbed (torch itself as a small numpy stand-in where tensors are touched), and is run on
two trees: the port as it was before #29 (commit ``UNFIXED_COMMIT``, built by
``tests.harness.port_build.build_unfixed``) must fail it, the port of the recipe must pass it.

- the verify mask: the runner's capture mode (``CudaGraphRunner.get_spec_info``) and the triton
  backend's capture and replay (``TritonAttnBackend.init_forward_metadata_*_cuda_graph``) under the
  v2 worker's verify input: a graph captured reading the mask buffer must get it refreshed on
  replay (else the kernel reads the stale buffer capture left: ones in its first
  ``(max_bs + max_bs*B)*B`` bytes, zeros after; a row sees all block tokens or none: wrong tokens,
  no crash);
- the penalties: the v2 verify applies the fields 0.5.11's overlap scheduler fills
  (``SamplingBatchInfo.copy_for_forward``), and the penalizer is fed each step;
- the overlap switch: an explicit ``--disable-overlap-schedule`` survives both switches.
"""

from __future__ import annotations

import ast
import contextlib
import shutil
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.harness.port_build import build_fixed, build_unfixed
from tests.harness.sources import sglang_wheel
from tests.unit.test_pr20547_port import route

SPEC = "sglang/srt/speculative"
RUNNER = "sglang/srt/model_executor/cuda_graph_runner.py"
TRITON = "sglang/srt/layers/attention/triton_backend.py"


# --------------------------------------------------------------------------------------------------
# The two trees
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("sglang-0.5.11-fixes")
    with zipfile.ZipFile(sglang_wheel("0.5.11")) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if n.startswith("sglang/")])
    return dest


def _tree(base: Path, dest: Path, files: dict[str, str]) -> Path:
    shutil.copytree(base / "sglang", dest / "sglang")
    for path, text in files.items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_text(text)
    return dest


@pytest.fixture(scope="module", params=["unfixed", "fixed"])
def tree(request, pristine, tmp_path_factory) -> tuple[str, Path]:
    files = build_unfixed(pristine) if request.param == "unfixed" else build_fixed()
    return request.param, _tree(pristine, tmp_path_factory.mktemp(request.param), files)


# --------------------------------------------------------------------------------------------------
# Running SGLang's own code with torch-level imports stubbed
# --------------------------------------------------------------------------------------------------


class T:
    """A tensor stand-in over a numpy array: the few torch methods the code below calls."""

    def __init__(self, a):
        self.a = np.asarray(a)

    ndim = property(lambda self: self.a.ndim)
    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    device = "cpu"

    def reshape(self, *shape):
        return T(self.a.reshape(shape))  # a view, as torch's on a contiguous tensor

    view = reshape

    def add_(self, other):
        self.a += other.a if isinstance(other, T) else other
        return self

    def to(self, *args, **kwargs):
        return self

    def __len__(self):
        return len(self.a)

    def __getitem__(self, key):
        return T(self.a[key])

    def __setitem__(self, key, value):
        self.a[key] = value.a if isinstance(value, T) else value

    def __lt__(self, other):
        return T(self.a < other)

    def __mul__(self, other):
        return T(self.a * (other.a if isinstance(other, T) else other))

    def __truediv__(self, other):
        return T(self.a / (other.a if isinstance(other, T) else other))


def _fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.Tensor = T
    torch.device = str
    torch.int64 = np.int64
    torch.float32 = np.float32
    torch.where = lambda c, x, y: T(np.where(c.a, x.a, y.a))
    torch.repeat_interleave = lambda x, n, dim=0: T(np.repeat(x.a, n, axis=dim))
    torch.tensor = lambda data, dtype=None, device=None: T(np.array(data, dtype=dtype))
    torch.compile = lambda *a, **k: (lambda f: f)
    nn = types.ModuleType("torch.nn")
    functional = types.ModuleType("torch.nn.functional")
    torch.nn, nn.functional = nn, functional
    return torch


@contextlib.contextmanager
def stubbed(**modules: types.ModuleType | dict):
    """``sys.modules`` with the given modules (a dict becomes a module of those names) for the
    duration, torch always the numpy stand-in; everything put back after."""
    torch = _fake_torch()
    given = {"torch": torch, "torch.nn": torch.nn, "torch.nn.functional": torch.nn.functional}
    for name, value in modules.items():
        name = name.replace("__", ".")
        if isinstance(value, dict):
            mod = types.ModuleType(name)
            mod.__dict__.update(value)
            value = mod
        given[name] = value
    saved = {name: sys.modules.get(name) for name in given}
    sys.modules.update(given)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def load(file: Path, name: str) -> types.ModuleType:
    """Execute a whole SGLang file as module ``name`` (its imports must be stubbed)."""
    mod = types.ModuleType(name)
    mod.__file__ = str(file)
    with stubbed(**{name.replace(".", "__"): mod}):  # dataclasses look their module up
        exec(compile(file.read_text(), str(file), "exec"), mod.__dict__)
    return mod


def method(file: Path, cls: str | None, name: str, env: dict) -> types.FunctionType:
    """One function (of class ``cls``) of an SGLang file, compiled alone with globals ``env``."""
    tree = ast.parse(file.read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    code = compile(ast.Module(body=[fn], type_ignores=[]), str(file), "exec")
    scope = dict(env)
    exec(code, scope)
    return scope[name]


class Algorithm:
    """``SpeculativeAlgorithm.DFLASH`` as the runner asks it: is_dflash() only."""

    def __getattr__(self, name):
        return (lambda: name == "is_dflash") if name.startswith("is_") else None


class Recorder:
    """A buffer that remembers being written (the triton backend's cuda_graph_custom_mask)."""

    def __init__(self):
        self.writes = 0
        self.shape = (1,)

    def __setitem__(self, key, value):
        self.writes += 1


# --------------------------------------------------------------------------------------------------
# 1. The verify mask under --attention-backend triton with CUDA graphs
# --------------------------------------------------------------------------------------------------


def v2_verify_custom_masks(root: Path) -> set:
    """The ``custom_mask`` each ``DFlashVerifyInput(...)`` of the v2 worker passes, resolved in
    its function (a name is followed to what the function assigns it)."""
    tree = ast.parse((root / SPEC / "dflash_worker_v2.py").read_text())
    out = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") ==
                    "DFlashVerifyInput"):  # fmt: skip
                continue
            value = next(k.value for k in call.keywords if k.arg == "custom_mask")
            if isinstance(value, ast.Name):
                assigned = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                            and any(getattr(t, "id", "") == value.id for t in n.targets)]
                out |= {ast.unparse(v) for v in assigned}
            else:
                out.add(ast.unparse(value))
    return out


def _custom_mask_statements(file: Path, method_name: str) -> ast.Module:
    """The statements of the triton backend's target-verify branch that set ``custom_mask``."""
    tree = ast.parse(file.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonAttnBackend")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method_name)
    branch = next(n for n in ast.walk(fn) if isinstance(n, ast.If)
                  and ast.unparse(n.test) == "forward_mode.is_target_verify()")  # fmt: skip
    stmts = []
    for stmt in branch.body:
        text = ast.unparse(stmt)
        if text.startswith("custom_mask = self.cuda_graph_custom_mask") or (
            isinstance(stmt, ast.If) and "custom_mask" in ast.unparse(stmt.test)
        ):
            stmts.append(stmt)
    assert len(stmts) == 2, [ast.unparse(s) for s in stmts]
    return ast.Module(body=stmts, type_ignores=[])


def run_triton_custom_mask(root: Path, method_name: str, spec_info) -> tuple[object, Recorder]:
    buffer = Recorder()
    backend = types.SimpleNamespace(cuda_graph_custom_mask=buffer)
    scope = {"self": backend, "spec_info": spec_info}
    exec(compile(_custom_mask_statements(root / TRITON, method_name), TRITON, "exec"), scope)
    return scope["custom_mask"], buffer


# The wrapping backends the port's verify-mask policy (0.5.23's, #52) imports when called: stand-in
# classes that no backend here is an instance of (none is wrapped in these checks).
WRAPPERS = {
    "sglang__srt__layers__attention__hybrid_attn_backend": {"HybridAttnBackend": type("H", (), {})},
    "sglang__srt__layers__attention__tbo_backend": {"TboAttnBackend": type("T", (), {})},
    "sglang__srt__model_executor__forward_batch_info": {"ForwardMode": None},
}


def verify_mask_outcome(root: Path) -> dict:
    """What 0.5.11's own code does with DFLASH verify under triton and CUDA graphs."""
    triton_backend = type("TritonAttnBackend", (), {})()  # the type name is what the policy reads
    stubs = {
        "sglang__srt__layers__quantization__unquant": {"UnquantizedLinearMethod": object},
        "sglang__srt__utils": {"is_cuda": lambda: False, "is_musa": lambda: False},
    }
    with stubbed(**stubs):
        dflash_utils = load(root / SPEC / "dflash_utils.py", "sglang.srt.speculative.dflash_utils")

    class DFlashVerifyInput(types.SimpleNamespace):
        pass

    with stubbed(sglang__srt__speculative__dflash_info={"DFlashVerifyInput": DFlashVerifyInput},
                 sglang__srt__speculative__dflash_utils=dflash_utils, **WRAPPERS):  # fmt: skip
        get_spec_info = method(root / RUNNER, "CudaGraphRunner", "get_spec_info",
                               {"CaptureHiddenMode": types.SimpleNamespace(NULL=0, FULL=2)})
        mask_buffer = Recorder()  # the runner's custom_mask buffer (ones, then zeros, after capture)
        runner = types.SimpleNamespace(
            model_runner=types.SimpleNamespace(
                spec_algorithm=Algorithm(), attn_backend=triton_backend, is_draft_worker=False,
                server_args=types.SimpleNamespace(speculative_num_draft_tokens=16,
                                                  speculative_eagle_topk=1),
            ),
            buffers=types.SimpleNamespace(custom_mask=mask_buffer),
            speculative_num_steps=1, speculative_num_draft_tokens=16, num_tokens_per_bs=16,
        )  # fmt: skip
        captured = get_spec_info(runner, 16)
    # The backend at capture, with the runner's spec_info; at replay, with the v2 worker's.
    capture_mask, _ = run_triton_custom_mask(root, "init_forward_metadata_capture_cuda_graph",
                                             captured)  # fmt: skip
    (v2_mask,) = v2_verify_custom_masks(root)
    replay_spec = types.SimpleNamespace(custom_mask=None if v2_mask == "None" else Recorder())
    _, replay_buffer = run_triton_custom_mask(root, "init_forward_metadata_replay_cuda_graph",
                                              replay_spec)  # fmt: skip
    with stubbed(**WRAPPERS):
        policy = dflash_utils.resolve_dflash_verify_mask_policy(triton_backend)
    return {
        "policy": policy,
        "runner_captures_with_mask": captured.custom_mask is mask_buffer,
        "graph_reads_mask_buffer": capture_mask is not None,
        "v2_verify_mask": v2_mask,
        "replay_refreshes_mask_buffer": replay_buffer.writes > 0,
    }


@pytest.mark.local
def test_the_triton_verify_graph_never_reads_a_stale_mask(tree):
    which, root = tree
    got = verify_mask_outcome(root)
    assert got["v2_verify_mask"] == "None"  # the PR's v2 worker verifies on the causal path
    stale = got["graph_reads_mask_buffer"] and not got["replay_refreshes_mask_buffer"]
    if which == "unfixed":
        # Today's port: captured in custom-mask mode, never refreshed: wrong tokens, no crash.
        assert got["policy"] == ("TritonAttnBackend", True) and stale, got
    else:
        assert got["policy"] == ("TritonAttnBackend", False), got
        assert not got["runner_captures_with_mask"] and not stale, got


# --------------------------------------------------------------------------------------------------
# 2. Penalties under overlap
# --------------------------------------------------------------------------------------------------


def sampling_info_fields(root: Path) -> set[str]:
    tree = ast.parse((root / "sglang/srt/sampling/sampling_batch_info.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SamplingBatchInfo")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}


def verify_with_penalties(root: Path) -> np.ndarray:
    """The v2 verify's logits adjustment, run from the patched module on the sampling info 0.5.11's
    overlap scheduler hands it (``copy_for_forward``: penalties accumulated, penalizer dropped)."""
    bs, block, vocab = 2, 3, 8
    fields = sampling_info_fields(root)
    assert {"acc_additive_penalties", "acc_scaling_penalties", "penalizer_orchestrator"} <= fields
    # What the PR reads: 0.5.9 defined it, 0.5.10 renamed it (0.5.14 / 0.5.23 still read it).
    assert "acc_linear_penalties" not in fields

    class SamplingInfo(types.SimpleNamespace):
        def __len__(self):
            return len(self.temperatures)

    additive = np.zeros((bs, vocab), np.float32)
    additive[0, 3] = -1.5  # a frequency/presence penalty on token 3 for request 0
    scaling = np.ones((bs, vocab), np.float32)
    scaling[1, 5] = 2.0  # a repetition penalty on token 5 for request 1
    info = SamplingInfo(**{f: None for f in fields})
    info.temperatures = T(np.ones((bs, 1), np.float32))
    info.has_custom_logit_processor = False
    info.acc_additive_penalties = T(additive)
    info.acc_scaling_penalties = T(scaling)
    info.penalizer_orchestrator = None  # dataclasses.replace(self, penalizer_orchestrator=None)

    penaltylib = root / "sglang/srt/sampling/penaltylib/repetition_penalty.py"
    with stubbed(sglang__srt__sampling__penaltylib__orchestrator={"_BatchedPenalizer": object},
                 sglang__srt__utils={"get_compiler_backend": lambda: None}):  # fmt: skip
        repetition = load(penaltylib, "sglang.srt.sampling.penaltylib.repetition_penalty")
    utils = {"_DFLASH_SAMPLING_VERIFY_AVAILABLE": False,
             "_get_or_create_chain_verify_buffers": None, "top_k_renorm_prob": None,
             "top_p_renorm_prob": None, "tree_speculative_sampling_target_only": None}
    with stubbed(sglang__srt__layers__sampler={"apply_custom_logit_processor": None},
                 sglang__srt__sampling__penaltylib__repetition_penalty=repetition,
                 sglang__srt__speculative__dflash_utils=utils,
                 # #52's rank-0 broadcast (not reached here: no sampled verify).
                 sglang__srt__distributed={"get_tp_group": None},
                 sglang__srt__layers__dp_attention={"get_attention_tp_group": None,
                                                    "is_dp_attention_enabled": None}):  # fmt: skip
        mod = load(root / SPEC / "dflash_utils_pr20547.py", "dflash_utils_pr20547")
    logits = T(np.full((bs * block, vocab), 3.0, np.float32))
    mod.apply_dflash_verify_logits_adjustments(
        next_token_logits=logits, sampling_info=info, draft_token_num=block
    )
    return logits.a.reshape(bs, block, vocab)


def penalizer_fed(root: Path) -> list | None:
    """What the v2 draft input's prepare_for_decode feeds the batch's penalizer (None: the
    method never feeds it)."""
    file = root / SPEC / "dflash_info_v2.py"
    tree = ast.parse(file.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DFlashDraftInputV2")
    prepare = next(n for n in cls.body if isinstance(n, ast.FunctionDef)
                   and n.name == "prepare_for_decode")  # fmt: skip
    called = {ast.unparse(c.func) for c in ast.walk(prepare) if isinstance(c, ast.Call)}
    # Module functions prepare_for_decode calls that feed the penalizer.
    helpers = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in called
               and "cumulate_output_tokens" in ast.unparse(n)]  # fmt: skip
    fed: list = []

    class Orchestrator:
        is_required = True

        def cumulate_output_tokens(self, ids):
            fed.append(ids.a.tolist())

    batch = types.SimpleNamespace(
        sampling_info=types.SimpleNamespace(penalizer_orchestrator=Orchestrator()),
        reqs=[types.SimpleNamespace(output_ids=[7, 9], origin_input_ids=[1]),
              types.SimpleNamespace(output_ids=[], origin_input_ids=[1, 4])],
        device="cpu",
    )  # fmt: skip
    with stubbed():
        torch = sys.modules["torch"]
        for name in helpers:
            method(file, None, name, {"torch": torch, "ScheduleBatch": object})(batch)
        if any("cumulate_output_tokens" in c for c in called):
            return ["inline"]  # fed inline in prepare_for_decode
    return fed or None


@pytest.mark.local
def test_v2_verify_applies_the_penalties_0511_accumulates(tree):
    which, root = tree
    out = verify_with_penalties(root)
    expected = np.full_like(out, 3.0)
    expected[0, :, 3] -= 1.5  # additive, over request 0's whole verify block
    expected[1, :, 5] /= 2.0  # scaling of a positive logit, over request 1's block
    if which == "unfixed":
        assert np.array_equal(out, np.full_like(out, 3.0))  # today's port: silently dropped
    else:
        assert np.allclose(out, expected), out


@pytest.mark.local
def test_v2_prepare_for_decode_feeds_the_penalizer(tree):
    which, root = tree
    fed = penalizer_fed(root)
    if which == "unfixed":
        assert fed is None
    else:
        # The newest token of each request (the last output, or the prompt's last), as 0.5.11's
        # EAGLE v2 prepare_for_decode feeds it.
        assert fed == [[9, 4]]


# --------------------------------------------------------------------------------------------------
# 3. --disable-overlap-schedule with both switches set
# --------------------------------------------------------------------------------------------------


@pytest.mark.local
def test_an_explicit_disable_overlap_schedule_is_honoured_under_both_switches(tree):
    which, root = tree
    both = {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_DFLASH_SPEC_V2": "1"}
    on = route(root, both)
    assert (on["disable_overlap_schedule"], on["worker"].rsplit(".", 1)[-1]) == (
        False, "DFlashWorkerV2")  # fmt: skip
    off = route(root, {**both, "_off": "1"})
    if which == "unfixed":
        assert off["disable_overlap_schedule"] is False  # today's port overrides the flag
    else:
        assert off["disable_overlap_schedule"] is True
        assert off["worker"].rsplit(".", 1)[-1] == "DFlashWorker"
