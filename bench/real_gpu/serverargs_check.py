#!/usr/bin/env python3
"""Runs launch plans through a real SGLang release's own ``ServerArgs`` (argument parsing and the
whole ``__post_init__``) on a real GPU machine, one forked child per plan, and prints one JSON
verdict per plan: accepted or refused (SGLang's own message), and every value SGLang changed.

The machine is one H200; each plan is for another machine. What the child swaps, at the torch
level so that SGLang's own predicates (``is_sm90_supported``, ``get_device_sm``...) run unchanged on
the swapped answers: ``get_device_memory_capacity`` (every sglang module that binds it) -> the
profile's GPU memory in MiB; ``torch.cuda.get_device_capability`` -> the profile's compute
capability; ``torch.cuda.get_device_name`` -> its name; ``torch.cuda.device_count`` -> its GPU
count; ``_get_device_sm_via_nvml`` (0.5.2x) -> None, so the SM comes from the swapped capability;
and every ``lru_cache`` of SGLang's modules is cleared, so no predicate keeps the H200's answer.
Nothing else is stubbed. 0.5.2x resolves through ``resolve_once()`` (see ``resolve``).
Model folders: ``--target-dir`` / ``--drafter-dir`` replace the plan's --model-path /
--speculative-draft-model-path (config.json only; no weights are read).

Usage (on the GPU machine, with the release importable):
    python3 serverargs_check.py --plans plans.json --builds 0.5.11 --release 0.5.11 \
        --target-dir models/k2-target --drafter-dir models/k2-drafter > verdicts.jsonl
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import select
import signal
import sys
import time
import traceback

# The fields a launch plan decides (or leaves to SGLang and says so): a change by SGLang to one of
# these must be in the plan's reasons.
PLAN_FIELDS = (
    "mem_fraction_static", "max_running_requests", "disable_overlap_schedule", "page_size",
    "attention_backend", "prefill_attention_backend", "decode_attention_backend",
    "speculative_draft_attention_backend", "speculative_num_draft_tokens",
    "speculative_dflash_draft_window_size", "speculative_draft_window_size",
    "disable_cuda_graph", "cuda_graph_max_bs", "chunked_prefill_size", "context_length",
    "disable_custom_all_reduce", "tp_size", "moe_runner_backend", "kv_cache_dtype",
)  # fmt: skip


def swap_paths(argv: list[str], target: str, drafter: str) -> list[str]:
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word == "--model-path":
            out[i + 1] = target
        elif word == "--speculative-draft-model-path":
            out[i + 1] = drafter
    return out


def jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def resolve(server_args_cls, ns: argparse.Namespace, server_argv: list[str]) -> dict:
    """The values the release's own launcher resolves from ``ns``: {field: value}, plus
    ``__path__`` naming the code that ran.

    Up to 0.5.1x the rules run in ``__post_init__``, so ``from_cli_args`` applies them. From
    0.5.2x (0.5.23) ``ServerArgs`` is a raw record: ``__post_init__`` does nothing and the
    launcher (``launch_server.run_server``) calls ``resolve_once()``, which runs
    ``arg_groups.pipeline.run_resolution_pipeline``; the resolved values are read back with
    ``resolved_dict()`` (the raw fields keep the input). ``prepare_server_args`` also marks
    whether ``--radix-eviction-policy`` was given; that is done here the same way."""
    if hasattr(server_args_cls, "resolve_once"):
        ns._radix_eviction_policy_explicitly_set = any(
            a == "--radix-eviction-policy" or a.startswith("--radix-eviction-policy=")
            for a in server_argv)
        sa = server_args_cls.from_cli_args(ns)
        sa.resolve_once()
        out = dict(sa.resolved_dict())
        out["__path__"] = ("from_cli_args + resolve_once (arg_groups.pipeline."
                           "run_resolution_pipeline) + resolved_dict")
        return out
    sa = server_args_cls.from_cli_args(ns)
    out = {name: getattr(sa, name) for name in vars(ns) if hasattr(sa, name)}
    out.update({k: getattr(sa, k) for k in PLAN_FIELDS if hasattr(sa, k)})
    out["__path__"] = "from_cli_args (the whole __post_init__)"
    return out


def preimport_rules() -> list[str]:
    """Import every module that holds a rule before the children fork, so that the swapped
    hardware answers reach the names those modules bind at import (0.5.2x imports its
    ``arg_groups`` hooks lazily, inside the pipeline)."""
    import importlib
    import pkgutil

    done = []
    try:
        import sglang.srt.arg_groups as groups
    except ImportError:
        return done
    for mod in pkgutil.iter_modules(groups.__path__):
        name = f"sglang.srt.arg_groups.{mod.name}"
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as exc:  # noqa: BLE001 - reported; the check itself shows the effect
            print(f"preimport {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return done


def child(plan: dict, args: argparse.Namespace, w: int) -> None:
    os.environ.update(plan.get("env") or {})
    import torch
    from sglang.srt.server_args import ServerArgs

    gpus = plan["gpus"]
    cap = tuple(int(x) for x in str(gpus["capability"]).split("."))
    mem_mib = float(gpus["memory_mib"])
    torch.cuda.get_device_capability = lambda device=None: cap
    torch.cuda.get_device_name = lambda device=None: gpus["name"]
    torch.cuda.device_count = lambda: int(gpus["count"])
    swapped, cleared = [], 0
    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang") and mod is not None:
            for fn in ("get_device_memory_capacity", "get_nvgpu_memory_capacity"):
                if callable(getattr(mod, fn, None)):
                    setattr(mod, fn, lambda *a, **k: mem_mib)
                    swapped.append(f"{name}.{fn}")
            # 0.5.2x reads the SM through NVML while torch.cuda is uninitialised (the real H200's
            # 9.0): None sends it to torch.cuda.get_device_capability, swapped above.
            if callable(getattr(mod, "_get_device_sm_via_nvml", None)):
                mod._get_device_sm_via_nvml = lambda *a, **k: None
                swapped.append(f"{name}._get_device_sm_via_nvml")
            # The hardware predicates (is_sm100_supported, is_blackwell...) are lru_cache'd and
            # may have answered for the H200 in the parent: forget those answers.
            for value in list(vars(mod).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
                    cleared += 1
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    argv = swap_paths(plan["argv"], args.target_dir, args.drafter_dir)
    server_argv = argv[argv.index("sglang.launch_server") + 1 :]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    result: dict = {"argv_run": argv, "swapped": sorted(set(swapped)), "caches_cleared": cleared}
    try:
        ns = parser.parse_args(server_argv)
        parsed = dict(vars(ns))
        resolved = resolve(ServerArgs, ns, server_argv)
        result["path"] = resolved.pop("__path__")
        changed = {}
        for name, value in parsed.items():
            if name in resolved and jsonable(value) != jsonable(resolved[name]):
                changed[name] = [jsonable(value), jsonable(resolved[name])]
        result.update(result="accepted", changed=changed,
                      values={k: jsonable(resolved.get(k)) for k in PLAN_FIELDS
                              if k in resolved})
    except SystemExit as exc:
        result.update(result="refused", error=f"argparse exit {exc.code}")
    except BaseException as exc:  # noqa: BLE001 - SGLang's refusal, whatever its type
        result.update(result="refused", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-3000:])
    result["log"] = logs.getvalue()[-6000:]
    os.write(w, json.dumps(result).encode())
    os.close(w)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--plans", required=True)
    p.add_argument("--builds", required=True, help="comma-separated plan builds to run")
    p.add_argument("--release", required=True, help="label of the installed tree")
    p.add_argument("--target-dir", required=True)
    p.add_argument("--drafter-dir", required=True)
    p.add_argument("--weights-bytes", type=int, default=0, help="for the modelled KV room")
    p.add_argument("--plan-timeout", type=float, default=120.0)
    args = p.parse_args()
    import sglang  # noqa: F401 - import once in the parent; each child forks from here
    import sglang.srt.server_args  # noqa: F401

    rules = preimport_rules()
    print(f"pre-imported {len(rules)} rule modules", file=sys.stderr)

    version = getattr(sglang, "__version__", "?")
    builds = set(args.builds.split(","))
    for plan in json.load(open(args.plans)):
        if plan.get("build") not in builds or "argv" not in plan:
            continue
        r, w = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                child(plan, args, w)
            except BaseException:  # noqa: BLE001 - outside SGLang's part: a crash of the check
                os.write(w, json.dumps({"result": "crashed",
                                        "error": traceback.format_exc()[-3000:]}).encode())
            finally:
                os._exit(0)
        os.close(w)
        data, deadline = b"", time.monotonic() + args.plan_timeout
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                data = json.dumps({"result": "crashed", "error": "no verdict within "
                                   f"{args.plan_timeout:.0f} s"}).encode()
                break
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        res = json.loads(data) if data else {"result": "crashed", "error": "child wrote nothing"}
        res.update(release=args.release, sglang_version=version, case=plan["case"],
                   build=plan["build"], key=plan["key"], argv=plan["argv"], env=plan["env"],
                   gpus=plan["gpus"], seconds=round(time.monotonic() - t0, 1))
        frac = (res.get("values") or {}).get("mem_fraction_static")
        tp = next((int(plan["argv"][i + 1]) for i, a in enumerate(plan["argv"][:-1])
                   if a == "--tp-size"), 1)
        if frac and args.weights_bytes:
            per_gpu = plan["gpus"]["memory_mib"] / 1024 * float(frac)
            res["modelled_load"] = {
                "budget_gib_per_gpu": round(per_gpu, 1),
                "weights_gib_per_gpu": round(args.weights_bytes / tp / 1024**3, 1),
                "kv_room_gib_per_gpu": round(per_gpu - args.weights_bytes / tp / 1024**3, 1),
                "note": "modelled: SGLang raises 'Not enough memory' at model load, not in "
                        "ServerArgs; budget = GPU memory x mem_fraction_static",
            }
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
