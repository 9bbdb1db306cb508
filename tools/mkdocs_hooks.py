"""MkDocs hooks for the documentation site (mkdocs.yml: ``hooks``).

The command pages document each command with mkdocs-click from its click object (``tpuctl.cli.init:init``,
...). The group adds the shared log options (``--log-level``, ``-v``) to a command when it loads it
(:class:`tpuctl.cli.app.LazyGroup`), so every command is loaded through the group first: each page then
shows exactly what ``tpuctl COMMAND --help`` prints.
"""

from __future__ import annotations

from typing import Any


def on_config(config: Any) -> Any:
    import click

    from tpuctl.cli.app import cli

    ctx = click.Context(cli, info_name="tpuctl")
    for name in cli.list_commands(ctx):
        cli.get_command(ctx, name)
    return config
