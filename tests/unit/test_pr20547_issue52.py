"""Issue #52: the PR#20547 port on SGLang 0.5.11 against 0.5.11's own DFlash v1 and upstream's later
fixes, run from the patched files' own code on the CPU.

Each check compiles the functions it needs from the port's built tree (``tests.harness.port_build``)
and runs them with only torch-level pieces stood in (a numpy tensor, a tokenizer of a few words),
on two trees: the port as its recipe was before #52 (``build_before_52``) must fail it, the port of
the recipe must pass it.

- stop strings inside an accepted block (0.5.14's string logic, under 0.5.11's ``check_finished``);
- an EOS inside a block that crosses ``max_new_tokens`` (0.5.18's order: tokens before the length);
- the KV reservation of the v2 ``prepare_for_decode`` for a request at its cap (0.5.14's reserve
  from ``kv_committed_len``): every slot it maps lies inside the request's ``req_to_token`` row.
"""

from __future__ import annotations

import ast
import contextlib
import shutil
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.harness.port_build import build_before_52, build_fixed
from tests.harness.sources import sglang_wheel
from tests.unit.test_pr20547_fixes import T, method, stubbed

SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
DFLASH_INFO_V2 = "sglang/srt/speculative/dflash_info_v2.py"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("sglang-0.5.11-issue52")
    with zipfile.ZipFile(sglang_wheel("0.5.11")) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if n.startswith("sglang/")])
    return dest


@pytest.fixture(scope="module", params=["before", "fixed"])
def tree(request, pristine, tmp_path_factory) -> tuple[str, Path]:
    files = build_before_52() if request.param == "before" else build_fixed()
    dest = tmp_path_factory.mktemp(request.param)
    shutil.copytree(pristine / "sglang", dest / "sglang")
    for path, text in files.items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_text(text)
    return request.param, dest


# --------------------------------------------------------------------------------------------------
# 1 and 2: Req.check_finished on a multi-token block
# --------------------------------------------------------------------------------------------------

FINISH_CLASSES = ("BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR",
                  "FINISHED_MATCHED_REGEX", "FINISH_LENGTH", "FINISH_ABORT")  # fmt: skip
REQ_METHODS = ("finished", "check_finished", "tail_str", "_stop_match_tail_len",
               "_check_token_based_finish", "_check_str_based_finish",
               "_locate_str_stop_finished_len", "_check_vocab_boundary_finish",
               "_cap_finished_len_at_max_new_tokens")  # fmt: skip


class WordTokenizer:
    """A stand-in for the request's HF tokenizer: one word per token id, decode joins them (the
    only tokenizer calls ``check_finished`` makes are ``decode`` and the EOS fields)."""

    WORDS = {1: "the", 2: " cat", 3: " sat", 4: " on", 5: " mat", 6: ".", 7: " STOP", 9: "</s>"}
    eos_token_id = 9
    additional_stop_token_ids = None

    def decode(self, ids) -> str:
        return "".join(self.WORDS[i] for i in ids)


def req_class(root: Path) -> type:
    """0.5.11's ``Req`` cut down to the methods that decide a finish (as the tree has them), with
    the finish-reason classes of the same file."""
    file = root / SCHEDULE_BATCH
    tree = ast.parse(file.read_text())
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in FINISH_CLASSES]
    env: dict = {}
    import re
    import typing
    env.update({name: getattr(typing, name) for name in ("List", "Optional", "Union")})
    env.update(re=re, HTTPStatus=__import__("http").HTTPStatus)
    exec(compile(ast.Module(body=classes, type_ignores=[]), str(file), "exec"), env)
    req = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Req")
    names = [n.name for n in req.body if isinstance(n, ast.FunctionDef) and n.name in REQ_METHODS]
    return type("Req", (), {name: method(file, "Req", name, env) for name in names})


def new_req(root: Path, prompt_out: list[int], block: list[int], max_new_tokens: int,
            stop_strs: tuple[str, ...] = ()):
    """A request after 0.5.11's multi-token result path: ``output_ids.extend(block)``; then
    ``check_finished(len(block))`` is what the scheduler calls."""
    req = req_class(root)()
    req.output_ids = list(prompt_out) + list(block)
    req.finished_reason = None
    req.finished_len = None
    req.to_finish = None
    req.grammar = None
    req.decoded_text = ""  # 0.5.11's scheduler never updates it
    req.vocab_size = 100
    req.eos_token_ids = {9}
    req.tokenizer = WordTokenizer()
    req.rid = "r0"
    req.sampling_params = types.SimpleNamespace(
        max_new_tokens=max_new_tokens, ignore_eos=False, stop_token_ids=set(),
        stop_strs=list(stop_strs),
        # SamplingParams.normalize: the longest stop string in tokens ("STOP" is one token).
        stop_str_max_len=1 if stop_strs else 0, stop_regex_strs=[], stop_regex_max_len=0,
    )  # fmt: skip
    return req


@pytest.mark.local
def test_a_stop_string_early_in_an_accepted_block_finishes_the_request_there(tree):
    which, root = tree
    # As upstream's own test (0.5.14): a one-token stop string at block position 1, four accepted.
    before_block = [1, 2, 3]
    block = [4, 7, 5, 6]
    req = new_req(root, before_block, block, max_new_tokens=64, stop_strs=(" STOP",))
    req.check_finished(len(block))
    if which == "before":
        # tail_str() decodes the last stop_str_max_len + 1 tokens (" mat."): the stop is missed
        # and the request runs on past it.
        assert req.finished_reason is None
    else:
        assert type(req.finished_reason).__name__ == "FINISH_MATCHED_STR"
        assert req.finished_reason.matched == " STOP"
        # Everything through the stop string is kept, nothing after it.
        assert req.finished_len == len(before_block) + 2
        assert req.output_ids[: req.finished_len][-1] == 7


@pytest.mark.local
def test_an_eos_in_a_block_that_crosses_the_cap_finishes_on_the_eos(tree):
    which, root = tree
    before_block = [1, 2, 3, 4, 5, 6, 1, 2]  # 8 tokens out, the cap is 10
    block = [9, 3, 4, 5]  # EOS first: output 9, one more to the cap, two past it
    req = new_req(root, before_block, block, max_new_tokens=10)
    req.check_finished(len(block))
    if which == "before":
        # The length cap is tested first: finished as "length" at 10, the token after the EOS
        # is emitted.
        assert type(req.finished_reason).__name__ == "FINISH_LENGTH"
        assert req.finished_len == 10 and req.output_ids[8:10] == [9, 3]
    else:
        assert type(req.finished_reason).__name__ == "FINISH_MATCHED_TOKEN"
        assert req.finished_reason.matched == 9
        assert req.finished_len == len(before_block) + 1
    # An EOS past the cap is still capped at it (0.5.18's _cap_finished_len_at_max_new_tokens).
    late = new_req(root, before_block, [3, 4, 5, 9], max_new_tokens=10)
    late.check_finished(4)
    assert type(late.finished_reason).__name__ == "FINISH_LENGTH" and late.finished_len == 10


@pytest.mark.local
def test_a_block_with_no_stop_still_finishes_at_the_cap(tree):
    _, root = tree
    req = new_req(root, [1, 2, 3, 4, 5, 6, 1, 2], [3, 4, 5, 6], max_new_tokens=10,
                  stop_strs=(" STOP",))  # fmt: skip
    req.check_finished(4)
    assert type(req.finished_reason).__name__ == "FINISH_LENGTH" and req.finished_len == 10


# --------------------------------------------------------------------------------------------------
# 3: the KV reservation near the context limit
# --------------------------------------------------------------------------------------------------


class Tensor(T):
    """``T`` (tests.unit.test_pr20547_fixes) with the few more torch methods prepare_for_decode
    calls."""

    def clone(self):
        return Tensor(self.a.copy())

    def tolist(self):
        return self.a.tolist()

    def sum(self):
        return Tensor(self.a.sum())

    def item(self):
        return self.a.item()

    def to(self, *args, dtype=None, device=None):
        return Tensor(self.a.astype(dtype)) if dtype is not None else Tensor(self.a.copy())

    def __getitem__(self, key):
        return Tensor(self.a[key])

    def __add__(self, other):
        return Tensor(self.a + (other.a if isinstance(other, T) else other))

    def __sub__(self, other):
        return Tensor(self.a - (other.a if isinstance(other, T) else other))


def reservation_at_the_cap(root: Path, context_len: int = 64, block: int = 8) -> dict:
    """Run the v2 ``prepare_for_decode`` of the tree for one request at its cap, with
    ``assign_req_to_token_pool_func`` (the kernel that writes ``req_to_token``) replaced by a
    recorder. Returns the row width and the (start, end) offsets it would write."""
    prompt = 10
    # tp_worker: max_req_len = context_len - 1; init_req_max_new_tokens: max_req_len - prompt - 1.
    max_new_tokens = context_len - 1 - prompt - 1
    out = max_new_tokens - 1  # the scheduler has not seen it finish: one token short of the cap
    committed = prompt + out - 1  # prefill commits the prompt; each verify commits its accept_len
    # 0.5.11's model runner: req_to_token rows are context_len + 4 + speculative_num_draft_tokens.
    row = context_len + 4 + block
    writes: list[tuple[int, int]] = []

    def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start, end, out_loc, bs):
        writes.extend(zip(start.tolist(), end.tolist(), strict=True))

    req = types.SimpleNamespace(
        kv_committed_len=committed,
        kv_allocated_len=committed + block,  # what the step before reserved
        output_ids=[1] * out, origin_input_ids=[1] * prompt,
        sampling_params=types.SimpleNamespace(top_k=1),
    )  # fmt: skip
    batch = types.SimpleNamespace(
        device="cpu", reqs=[req], batch_size=lambda: 1, maybe_wait_verify_done=lambda: None,
        # Under overlap the device's seq_lens already hold the block in flight (accepted whole).
        seq_lens=Tensor(np.array([committed + block], np.int64)),
        req_pool_indices=Tensor(np.array([0])),
        req_to_token_pool=types.SimpleNamespace(req_to_token=Tensor(np.zeros((1, row), np.int32))),
        token_to_kv_pool_allocator=types.SimpleNamespace(page_size=1),
        tree_cache=None,
        sampling_info=types.SimpleNamespace(
            penalizer_orchestrator=types.SimpleNamespace(is_required=False)),
    )  # fmt: skip
    file = root / DFLASH_INFO_V2
    with stubbed():
        import sys

        torch = sys.modules["torch"]
        torch.Tensor = Tensor
        torch.int32, torch.int64 = np.int32, np.int64
        torch.tensor = lambda data, dtype=None, device=None: Tensor(np.array(data, dtype=dtype))
        torch.maximum = lambda x, y: Tensor(np.maximum(x.a, y.a))
        env = {
            "torch": torch, "ScheduleBatch": object,
            "_get_overlap_plan_stream": lambda device: (None, contextlib.nullcontext()),
            "get_global_server_args": lambda: types.SimpleNamespace(
                speculative_num_draft_tokens=block),
            "alloc_token_slots": lambda cache, n: Tensor(np.arange(n)),
            "assign_req_to_token_pool_func": assign_req_to_token_pool_func,
        }  # fmt: skip
        source = ast.parse(file.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "_cumulate_penalizer_tokens"
               for n in source.body):  # fmt: skip
            env["_cumulate_penalizer_tokens"] = method(file, None, "_cumulate_penalizer_tokens",
                                                       env)  # fmt: skip
        prepare = method(file, "DFlashDraftInputV2", "prepare_for_decode", env)
        prepare(types.SimpleNamespace(verify_done=None), batch)
    return {"row": row, "writes": writes, "allocated": req.kv_allocated_len}


@pytest.mark.local
def test_the_v2_reservation_stays_inside_the_request_row_at_its_cap(tree):
    which, root = tree
    got = reservation_at_the_cap(root)
    assert got["writes"], got  # the step reserves slots
    ends = [end for _, end in got["writes"]]
    if which == "before":
        # seq_lens + 2B from the device: context_len + 20 for B = 8, past the 76-wide row (the
        # tail lands in the next request's row, or past the tensor).
        assert max(ends) == 64 + 20 > got["row"], got
    else:
        assert all(start <= end <= got["row"] for start, end in got["writes"]), got
        assert got["allocated"] == max(ends)


# --------------------------------------------------------------------------------------------------
# 5: the verify-mask policy through 0.5.11's wrapping attention backends
# --------------------------------------------------------------------------------------------------


def backend_class(root: Path, rel: str, name: str) -> type:
    """Class ``name`` of an SGLang file, its imports bound to ``object`` (only the wrapping
    constructors run here, which store the backends they are given)."""
    file = root / rel
    tree = ast.parse(file.read_text())
    env: dict = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                env[(alias.asname or alias.name).split(".")[0]] = object
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    exec(compile(ast.Module(body=[cls], type_ignores=[]), str(file), "exec"), env)
    return env[name]


def mask_policies(root: Path) -> dict[str, tuple[str, bool]]:
    """``resolve_dflash_verify_mask_policy`` of the tree for triton reached through each of
    0.5.11's wrappers (built by their own constructors; 0.5.11's ForwardMode, whose
    ``is_target_verify`` HybridAttnBackend._select_backend asks)."""
    import enum

    from tests.unit.test_pr20547_fixes import load

    attention = "sglang/srt/layers/attention/"
    hybrid = backend_class(root, attention + "hybrid_attn_backend.py", "HybridAttnBackend")
    tbo = backend_class(root, attention + "tbo_backend.py", "TboAttnBackend")
    file = root / "sglang/srt/model_executor/forward_batch_info.py"
    cls = next(n for n in ast.parse(file.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "ForwardMode")  # fmt: skip
    env = {"IntEnum": enum.IntEnum, "auto": enum.auto}
    exec(compile(ast.Module(body=[cls], type_ignores=[]), str(file), "exec"), env)
    stubs = {
        "sglang__srt__layers__quantization__unquant": {"UnquantizedLinearMethod": object},
        "sglang__srt__utils": {"is_cuda": lambda: False, "is_musa": lambda: False},
        "sglang__srt__layers__attention__hybrid_attn_backend": {"HybridAttnBackend": hybrid},
        "sglang__srt__layers__attention__tbo_backend": {"TboAttnBackend": tbo},
        "sglang__srt__model_executor__forward_batch_info": {"ForwardMode": env["ForwardMode"]},
    }
    triton = type("TritonAttnBackend", (), {})  # the skip-set matches the type's name
    other = type("FlashInferAttnBackend", (), {})
    linear = types.SimpleNamespace  # HybridLinearAttnBackend: full_attn_backend

    def runner(mode: str):
        return types.SimpleNamespace(kv_cache_dtype=None, server_args=types.SimpleNamespace(
            speculative_attention_mode=mode))  # fmt: skip

    cases = {
        "triton": triton(),
        "hybrid_prefill": hybrid(runner("prefill"), prefill_backend=triton(),
                                 decode_backend=other()),
        "hybrid_decode": hybrid(runner("decode"), prefill_backend=other(),
                                decode_backend=triton()),
        "tbo": tbo(primary=triton(), children=[triton(), triton()]),
        "tbo_hybrid_linear": tbo(primary=linear(full_attn_backend=triton()),
                                 children=[triton(), triton()]),
    }  # fmt: skip
    with stubbed(**stubs):
        utils = load(root / "sglang/srt/speculative/dflash_utils.py", "dflash_utils_52")
        return {k: utils.resolve_dflash_verify_mask_policy(v) for k, v in cases.items()}


@pytest.mark.local
def test_triton_through_a_hybrid_or_two_batch_overlap_backend_skips_the_mask(tree):
    which, root = tree
    got = mask_policies(root)
    assert got["triton"] == ("TritonAttnBackend", False)  # #29's fix, both trees
    if which == "before":
        # Matched by the wrapper's name: the graph is captured reading a mask the v2 verify
        # never refreshes.
        assert got["hybrid_prefill"] == ("HybridAttnBackend", True)
        assert got["tbo"] == ("TboAttnBackend", True)
    else:
        assert set(got.values()) == {("TritonAttnBackend", False)}, got


# --------------------------------------------------------------------------------------------------
# 4: the ranks under sampling (two CPU processes in a gloo group, real torch.distributed)
# --------------------------------------------------------------------------------------------------

# Run by each rank with the CPU-torch Python (tests.harness.torch_cpu): argv = tree, rank, store.
# The patched module runs as written; only its imports from SGLang are given here: 0.5.11's own
# _get_or_create_chain_verify_buffers and GroupCoordinator.broadcast (compiled from the wheel's
# files), the gloo world as the TP group, and a STAND-IN for sgl_kernel's
# tree_speculative_sampling_target_only (a CUDA op: nothing can run it here), which on a chain
# accepts draft j while uniform_samples[i, j] < target_probs[i, j, candidate] and samples the
# final token from the target distribution with the final coin, as the op's contract says.
RANK_SCRIPT = r'''
import ast, json, sys, types
import torch, torch.distributed as dist

tree, rank, store = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)

def function(path, cls, name, env):
    src = ast.parse(open(path).read())
    body = src.body
    if cls:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    scope = dict(env)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), scope)
    return scope[name]

srt = tree + "/sglang/srt/"
buffers = function(srt + "speculative/dflash_utils.py", None, "_get_or_create_chain_verify_buffers",
                   {"torch": torch, "_DFLASH_CHAIN_VERIFY_BUFFERS": {}})
group = types.SimpleNamespace(world_size=2, ranks=[0, 1], rank_in_group=rank,
                              device_group=dist.group.WORLD)
group.broadcast = types.MethodType(
    function(srt + "distributed/parallel_state.py", "GroupCoordinator", "broadcast",
             {"torch": torch}), group)

def standin_tree_speculative_sampling_target_only(*, predicts, accept_index, accept_token_num,
        candidates, uniform_samples, uniform_samples_for_final_sampling, target_probs, **_):
    bs, n = candidates.shape
    for i in range(bs):
        k = 0
        accept_index[i].fill_(-1)
        accept_index[i, 0] = i * n
        while k + 1 < n and uniform_samples[i, k + 1] < target_probs[i, k, candidates[i, k + 1]]:
            k += 1
            accept_index[i, k] = i * n + k
            predicts[i * n + k - 1] = candidates[i, k]
        cdf = torch.cumsum(target_probs[i, k], 0)
        predicts[i * n + k] = int(torch.searchsorted(cdf, uniform_samples_for_final_sampling[i]))
        accept_token_num[i] = k

def module(name, **names):
    mod = types.ModuleType(name)
    mod.__dict__.update(names)
    sys.modules[name] = mod

module("sglang.srt.layers.sampler", apply_custom_logit_processor=None)
module("sglang.srt.sampling.penaltylib.repetition_penalty", apply_scaling_penalties=None)
module("sglang.srt.speculative.dflash_utils", _DFLASH_SAMPLING_VERIFY_AVAILABLE=True,
       _get_or_create_chain_verify_buffers=buffers, top_k_renorm_prob=None,
       top_p_renorm_prob=None,
       tree_speculative_sampling_target_only=standin_tree_speculative_sampling_target_only)
module("sglang.srt.distributed", get_tp_group=lambda: group)
module("sglang.srt.layers.dp_attention", get_attention_tp_group=lambda: group,
       is_dp_attention_enabled=lambda: False)
path = srt + "speculative/dflash_utils_pr20547.py"
mod = types.ModuleType("dflash_utils_pr20547")
exec(compile(open(path).read(), path, "exec"), mod.__dict__)

bs, n, vocab = 2, 4, 8
candidates = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 1]])
logits = torch.zeros((bs * n, vocab))
logits[torch.arange(bs * n), candidates.roll(-1, 1).reshape(-1)] = 2.0  # drafts are likely
info = types.SimpleNamespace(temperatures=torch.ones((bs, 1)), need_top_k_sampling=False,
                             need_top_p_sampling=False)
# Each rank draws its own coins (torch.rand on every rank): rank 0 accepts the whole chain and
# samples low, rank 1 rejects the first draft and samples high.
coins = torch.full((bs, n), 0.0 if rank == 0 else 0.999)
final = torch.full((bs,), 0.01 if rank == 0 else 0.99)
accept_len, bonus = mod.compute_dflash_sampling_accept_len_and_bonus(
    candidates=candidates, next_token_logits=logits, sampling_info=info, threshold_single=1.0,
    threshold_acc=1.0, uniform_samples=coins, uniform_samples_for_final_sampling=final)
print(json.dumps({"rank": rank, "accept_len": accept_len.tolist(), "bonus": bonus.tolist()}),
      flush=True)
# Both ranks done before either leaves, and no teardown after: gloo's transport threads outliving
# a rank whose peer has already gone abort it ("terminate called without an active exception",
# SIGABRT, seen once in CI on 2 busy cores).
dist.barrier()
import os
os._exit(0)
'''


def sampled_verify_on_two_ranks(root: Path, tmp_path: Path) -> list[dict]:
    import json
    import subprocess

    from tests.harness.torch_cpu import torch_python

    python = str(torch_python())
    store = tmp_path / "gloo-store"
    procs = [subprocess.Popen([python, "-c", RANK_SCRIPT, str(root), str(rank), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]  # fmt: skip
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.local
def test_every_rank_keeps_rank_0s_sampled_decision(tree, tmp_path):
    which, root = tree
    rank0, rank1 = sampled_verify_on_two_ranks(root, tmp_path)
    # Rank 0's own draw: the whole chain accepted, the bonus sampled from the low end.
    assert rank0["accept_len"] == [3, 3], rank0
    if which == "before":
        # No broadcast: each rank keeps its own decision, and the ranks part ways.
        assert rank1["accept_len"] == [0, 0] and rank1["bonus"] != rank0["bonus"], rank1
    else:
        assert (rank1["accept_len"], rank1["bonus"]) == (rank0["accept_len"], rank0["bonus"])
