"""What the server would fail to import, found here, without torch or a GPU (runs 1 and 2 were lost
to a missing `gguf` and `flashinfer`; this scan found IPython and dill for the lab run): from the
modules a DFLASH text server loads (``ENTRY``), every module-level ``import`` of SGLang's own
modules is followed (function bodies are not: they import late; ``try`` blocks are guarded;
``if TYPE_CHECKING`` is skipped), and each top-level package that is neither the standard library
nor present in the given folders is listed: ``MISSING`` where the import is unconditional,
``conditional`` where it sits under an ``if`` (a platform switch, e.g. ROCm's aiter or NPU's
torch_npu, which do not run on an H200).

    python bench/real_gpu/import_scan.py SITE [MORE_SITE_FOLDERS ...] [--image NAME ...]

``--image``: top-level modules the device image holds that are not in any folder here (torch,
triton, torchvision). Exit 1 when anything is MISSING.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ENTRY = ["sglang", "sglang.launch_server", "sglang.srt.entrypoints.http_server",
         "sglang.srt.managers.scheduler", "sglang.srt.managers.tokenizer_manager",
         "sglang.srt.managers.detokenizer_manager", "sglang.srt.model_executor.model_runner",
         "sglang.srt.model_executor.cuda_graph_runner", "sglang.srt.models.deepseek_v2",
         "sglang.srt.models.dflash", "sglang.srt.speculative.dflash_worker",
         "sglang.srt.speculative.dflash_worker_v2", "sglang.srt.speculative.spec_info",
         "sglang.srt.layers.attention.flashattention_backend",
         "sglang.srt.layers.attention.triton_backend",
         "sglang.srt.entrypoints.openai.serving_chat", "sglang.srt.constrained.xgrammar_backend",
         "sglang.srt.parser.reasoning_parser", "sglang.srt.function_call.function_call_parser"]


def module_file(site: Path, mod: str) -> Path | None:
    p = site / Path(*mod.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def imports(f: Path, mod: str) -> list[tuple[str, bool, bool]]:
    """(module, is_maybe_an_attribute, conditional) of the module-level imports of ``f``."""
    out: list[tuple[str, bool, bool]] = []

    def visit(stmts, cond: bool) -> None:
        for n in stmts:
            if isinstance(n, ast.Import):
                out.extend((a.name, False, cond) for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    base = mod.split(".")
                    if f.name != "__init__.py":
                        base = base[:-1]
                    base = base[:len(base) - (n.level - 1)]
                    m = ".".join(base + ([n.module] if n.module else []))
                else:
                    m = n.module or ""
                out.append((m, False, cond))
                out.extend((f"{m}.{a.name}", True, cond) for a in n.names)
            elif isinstance(n, ast.If) and "TYPE_CHECKING" not in ast.unparse(n.test):
                visit(n.body, True)
                visit(n.orelse, True)

    visit(ast.parse(f.read_text()).body, False)
    return out


def scan(site: Path, present: set[str]) -> dict[str, dict[str, set[str]]]:
    std = set(sys.stdlib_module_names)
    seen: set[str] = set()
    found: dict[str, dict[str, set[str]]] = {"MISSING": {}, "conditional": {}}
    todo = [(m, False) for m in ENTRY]
    while todo:
        mod, cond = todo.pop()
        if (mod, cond) in seen or (mod, False) in seen:
            continue
        seen.add((mod, cond))
        f = module_file(site, mod)
        if f is None:
            continue
        for name, maybe_attr, c in imports(f, mod):
            c = c or cond
            root = name.split(".")[0]
            if root == "sglang":
                parts = name.split(".")
                todo += [(".".join(parts[:i]), c) for i in range(1, len(parts) + 1)
                         if module_file(site, ".".join(parts[:i]))]
            elif root and not maybe_attr and root not in std and root not in present:
                found["conditional" if c else "MISSING"].setdefault(root, set()).add(mod)
    for root in list(found["conditional"]):
        if root in found["MISSING"]:
            del found["conditional"][root]
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sites", nargs="+", type=Path)
    ap.add_argument("--image", nargs="*", default=[])
    args = ap.parse_args(argv)
    present = set(args.image)
    for d in args.sites:
        for p in d.iterdir():
            present.add(p.name.split(".")[0].split("-")[0])
    found = scan(args.sites[0], present)
    for kind in ("MISSING", "conditional"):
        for root, mods in sorted(found[kind].items()):
            print(f"{kind} {root}: imported by {', '.join(sorted(mods)[:3])}")
    print(f"import_scan: {len(found['MISSING'])} missing, {len(found['conditional'])} "
          "conditional (platform switches)")
    return 1 if found["MISSING"] else 0


if __name__ == "__main__":
    sys.exit(main())
