"""Every option of every ``specfleet`` subcommand says what it does in ``--help`` (issue 56)."""

from __future__ import annotations

import click

from specfleet.cli import cli


def test_every_option_has_help_text():
    bare = [f"specfleet {name} {'/'.join(p.opts)}" for name, cmd in sorted(cli.commands.items())
            for p in cmd.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    bare += [f"specfleet {'/'.join(p.opts)}" for p in cli.params
             if isinstance(p, click.Option) and not (p.help or "").strip()
             and "--version" not in p.opts]
    assert bare == []
