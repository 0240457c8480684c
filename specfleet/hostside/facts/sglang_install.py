"""facts.sglang.SGLangInstall: the files of the installed SGLang that the parser reads, never
importing it (find_spec locates the package without running its __init__, which imports torch).
argv[1]: the request (``collect_request``); argv[2] (tests only): a directory to search first.
Prints the Python literal of what it found (``None`` without SGLang). Run with -I -S: the site
folders are found by ``site_paths`` and an editable install by ``editable_packages``, no .pth
file's code runs."""
# needs: installed_dists, dist_version, site_paths, editable_packages

import ast
import importlib.util as iu
import os
import sys

req = {"dirs": [], "texts": [], "lines": {}, "compiles": [], "imports": [], "when": None}
for row in sys.argv[1].split("\n"):
    kind, *rest = row.split("\t")
    if kind == "line":
        req["lines"][rest[0]] = rest[1:]
    elif kind in ("dir", "text", "compile", "import"):
        req[kind + "s" if kind != "compile" else "compiles"].append(rest[0])
    elif kind == "when":
        req["when"] = rest[0]
site = site_paths()
sys.path += [p for p in site if p not in sys.path]
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
try:
    spec = iu.find_spec("sglang")
except (ImportError, ValueError):
    spec = None
locs = list(spec.submodule_search_locations or []) if spec else []
if not locs:  # an editable install: the folder its finder maps, as the finder would find it
    mapped = editable_packages(site).get("sglang")
    if mapped and os.path.isfile(os.path.join(mapped, "__init__.py")):
        locs = [mapped]
if not locs:
    print(None)
    sys.exit(0)
loc = locs[0]
version = dist_version(sys.path, "sglang")
def read(rel):
    try:
        with open(os.path.join(loc, rel), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
out = {"location": loc, "dist_version": version, "dirs": {}, "texts": {}, "lines": {}}
for rel in req["dirs"]:
    path = os.path.join(loc, rel)
    out["dirs"][rel] = sorted(os.listdir(path)) if os.path.isdir(path) else None
for rel in req["texts"]:
    out["texts"][rel] = read(rel)
for rel, needles in req["lines"].items():
    text = read(rel)
    out["lines"][rel] = None if text is None else [
        line for line in text.splitlines() if any(n in line for n in needles)
    ]


def top_names(tree):
    """Names a module defines at its top level (into if/try blocks, as imports often are)."""
    names, stack = set(), list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(
            node.target, ast.Name
        ):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.If):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody
            for h in node.handlers:
                stack += h.body
    return names


def module_rel(mod):
    """sglang.srt.x -> (rel path of its file, is a package) in this tree, or None."""
    parts = mod.split(".")[1:]
    base = os.path.join(*parts) if parts else ""
    if parts and os.path.isfile(os.path.join(loc, base + ".py")):
        return base + ".py"
    if os.path.isfile(os.path.join(loc, base, "__init__.py")):
        return os.path.join(base, "__init__.py")
    return None


parsed = {}
exports = {}


def exported(rel):
    """Names module ``rel`` defines, with those of the sglang modules it star-imports."""
    if rel in exports:
        return exports[rel]
    exports[rel] = set()  # a star-import cycle ends here
    tree = parse(rel)
    if tree is None:
        return exports[rel]
    names = top_names(tree)
    package = os.path.dirname(rel).replace(os.sep, ".")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(["sglang", *base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            target = module_rel(mod) if mod.split(".")[0] == "sglang" else None
            if target:
                names |= exported(target)
    exports[rel] = names
    return names


def parse(rel):
    if rel not in parsed:
        text = read(rel)
        try:
            parsed[rel] = None if text is None else ast.parse(text, rel)
        except SyntaxError:
            parsed[rel] = None
    return parsed[rel]


# The wiring checks run only where the file named by `when` is there (a v2 worker): compile each
# file, and resolve each `from sglang... import NAME` of the import-checked files in this tree.
if req["when"] and os.path.isfile(os.path.join(loc, req["when"])):
    out["compile_errors"] = {}
    for rel in req["compiles"]:
        text = read(rel)
        if text is None:
            continue
        try:
            compile(text, rel, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as e:
            where = getattr(e, "lineno", None) or "?"
            out["compile_errors"][rel] = f"{getattr(e, 'msg', e)} (line {where})"
    out["unresolved"] = {}
    for rel in req["imports"]:
        tree = parse(rel)
        if tree is None:
            continue
        missing = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] != "sglang":
                continue
            target = module_rel(node.module)
            if target is None:
                missing.append(node.module)
                continue
            names = None
            for a in node.names:
                if a.name == "*" or module_rel(node.module + "." + a.name):
                    continue
                if names is None:
                    names = exported(target)
                if a.name not in names and "__getattr__" not in names:
                    missing.append(node.module + "." + a.name)
        if missing:
            out["unresolved"][rel] = sorted(set(missing))
print(repr(out))
