"""Every command line of the documentation (README.md and every page of docs/, docs/incoming/
included, whatever files it holds) goes through the CLI that would run it:

- a ``specfleet ...`` line through the ``specfleet`` click command itself: the subcommand must
  exist and every option the line names must be one of that subcommand's (a synopsis such as
  ``[--batch-size N | --batch-percent P]`` is read option by option); a line with no
  placeholder in it is parsed whole by click's own parser, so an option given a value it does
  not take, or a missing one, fails too;
- a ``pyinfra ...`` line through pyinfra's own click command the same way, and every file it
  names that is not a placeholder (``INVENTORY``, ``my_host.py``) must exist in the checkout.

A command line is a line of a fenced block (shell, or no language) or an inline code span that
starts with the program's name and a space; ``\\`` continues it on the next line.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[2]
FENCE_RE = re.compile(r"^```(\w*)\s*$")
INLINE_RE = re.compile(r"`((?:specfleet|pyinfra) [^`]+)`")
PROGRAMS = ("specfleet", "pyinfra")
# Files a line names that the user makes (the README's quickstart copies first_host.py).
USER_FILES = {"inventories/my_host.py", "facts.json", "settings.json", "config.py"}
INLINE = " ..."  # marks an inline span's command as a synopsis (``is_synopsis``)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every specfleet/pyinfra command line of a markdown text."""
    found: list[tuple[int, str]] = []
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for n, line in enumerate(text.splitlines(), start=1):
        m = FENCE_RE.match(line.strip())
        if m:
            fence = None if fence is not None else m.group(1)
            pending = None
            continue
        if fence is not None and fence in ("", "sh", "shell", "bash", "console"):
            body = line.strip().removeprefix("$ ")
            if pending is not None:
                start, so_far = pending
                body = so_far + " " + body
                n = start
            elif not body.startswith(tuple(p + " " for p in PROGRAMS)):
                continue
            if body.endswith("\\"):
                pending = (n, body[:-1].rstrip())
                continue
            pending = None
            found.append((n, body))
        elif fence is None:
            # An inline span is a mention in prose ("`specfleet fanout --sshd-port`"): its
            # options are checked by name, as a synopsis's.
            found += [(n, m.group(1) + INLINE) for m in INLINE_RE.finditer(line)]
    return found


def _all_lines() -> list[tuple[str, str]]:
    out = []
    for doc in documents():
        for n, line in command_lines(doc.read_text()):
            out.append((f"{doc.relative_to(REPO)}:{n}", line))
    return out


def words(line: str) -> list[str]:
    """The line's words, without a trailing comment and what follows a shell operator."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in an inline span: split on spaces
        tokens = line.split()
    for i, t in enumerate(tokens):
        if t in ("&&", "||", ";", ">", ">>", "|", "2>&1", "<") or t.startswith(">"):
            return tokens[:i]
    return tokens


def options_of(tokens: list[str]) -> list[str]:
    """Every option a (synopsis) line names: ``[--a N | --b]`` gives --a and --b."""
    opts = []
    for t in tokens:
        for part in re.split(r"[\[\]|]+", t):
            part = part.strip(".,;:")
            if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", part):
                opts.append(part.split("=", 1)[0])
    return opts


def is_synopsis(tokens: list[str]) -> bool:
    return any(re.search(r"[\[\]|]|\.\.\.|^[A-Z][A-Z_0-9]+(=|$)|<|>|^[A-Z]+[,|]", t)
               for t in tokens)


def option_names(cmd: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for p in cmd.params:
        if isinstance(p, click.Option):
            names.update(p.opts)
            names.update(p.secondary_opts)
    return names


def check(cmd: click.Command, prog: str, args: list[str], synopsis: bool) -> list[str]:
    """What is wrong with ``args`` for ``cmd`` ([] when nothing)."""
    known = option_names(cmd)
    unknown = [o for o in options_of(args) if o not in known
               and not (o.startswith("-") and not o.startswith("--") and len(o) > 2
                        and all(f"-{c}" in known for c in o[1:]))]
    if unknown:
        return [f"{prog}: unknown option(s) {unknown}"]
    if synopsis:
        return []
    ctx = click.Context(cmd, info_name=prog)
    try:
        cmd.make_parser(ctx).parse_args(list(args))
    except click.UsageError as exc:
        return [f"{prog}: {exc.format_message()}"]
    return []


def specfleet_problems(tokens: list[str]) -> list[str]:
    from specfleet.cli import cli

    args = tokens[1:]
    while args and args[0].startswith("--") and args[0] in option_names(cli):
        args = args[2:] if args[0] == "--checkout" else args[1:]
    if not args or args[0].startswith("-"):
        return check(cli, "specfleet", args, is_synopsis(args))
    sub = cli.commands.get(args[0].strip("[]"))
    if sub is None:
        if is_synopsis(args[:1]):
            return []  # `specfleet SUBCOMMAND --help`
        return [f"specfleet has no subcommand {args[0]!r} ({', '.join(sorted(cli.commands))})"]
    return check(sub, f"specfleet {args[0]}", args[1:], is_synopsis(args[1:]))


def pyinfra_problems(tokens: list[str]) -> list[str]:
    from pyinfra_cli.main import cli as pyinfra_cli

    problems = check(pyinfra_cli, "pyinfra", tokens[1:], synopsis=True)
    for t in tokens[1:]:
        path = t.split("=", 1)[-1] if t.startswith("--") else t
        looks_like_file = re.fullmatch(r"[\w./-]+\.(py|json)", path) and "/" in path
        if looks_like_file and path not in USER_FILES and not (REPO / path).exists():
            problems.append(f"pyinfra: {path} is not a file of the checkout")
    return problems


def test_the_documentation_has_command_lines_of_both_programs():
    lines = [line for _, line in _all_lines()]
    assert sum(line.startswith("specfleet ") for line in lines) >= 20
    assert sum(line.startswith("pyinfra ") for line in lines) >= 5


@pytest.mark.parametrize("where,line", _all_lines(), ids=lambda v: v if ":" in v else "")
def test_every_command_line_of_the_docs_parses(where, line):
    tokens = words(line)
    problems = (specfleet_problems if tokens[0] == "specfleet" else pyinfra_problems)(tokens)
    assert problems == [], f"{where}: {line}"


@pytest.mark.parametrize("line,bad", [
    ("specfleet rollout INVENTORY deploys/kimi_k26.py [--canary HOST] [--no-such-flag]", True),
    ("specfleet status inventories/first_host.py --json --fail-on-drift", False),
    ("specfleet status inventories/first_host.py --jsno", True),
    ("specfleet statuz INVENTORY", True),
    ("specfleet bench inventories/first_host.py --max-tokens", True),
    ("pyinfra inventories/first_host.py deploys/kimi_k26.py --dry", False),
    ("pyinfra inventories/first_host.py deploys/kimi_k26.py --dryy", True),
    ("pyinfra inventories/first_host.py deploys/no_such_deploy.py --dry", True),
])
def test_the_check_fails_on_an_unknown_option_subcommand_or_file(line, bad):
    tokens = words(line)
    problems = (specfleet_problems if tokens[0] == "specfleet" else pyinfra_problems)(tokens)
    assert bool(problems) is bad, problems


def test_a_new_incoming_page_is_read_too(tmp_path):
    text = "# x\n\n```\nspecfleet status INVENTORY \\\n    --fail-on-drift\n```\n"
    assert command_lines(text) == [(4, "specfleet status INVENTORY --fail-on-drift")]
    assert command_lines("see `pyinfra @local fact facts.gpu.Gpus` here") == [
        (1, "pyinfra @local fact facts.gpu.Gpus ...")]
