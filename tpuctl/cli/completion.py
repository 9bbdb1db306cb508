"""``tpuctl completion bash|zsh|fish``: click's shell completion script for tpuctl."""

from __future__ import annotations

import click

from tpuctl.errors import InputError
from tpuctl.messages import did_you_mean

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_TPUCTL_COMPLETE"
"""The variable the script sets when it asks tpuctl for completions (click's ``_PROG_COMPLETE``)."""


@click.command("completion")
@click.argument("shell", metavar="SHELL")
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish): commands, options, choices.

    \b
      eval "$(tpuctl completion bash)"                     # in ~/.bashrc
      eval "$(tpuctl completion zsh)"                      # in ~/.zshrc
      tpuctl completion fish > ~/.config/fish/completions/tpuctl.fish
    The script calls tpuctl with _TPUCTL_COMPLETE set; tpuctl answers with the completions.

    Exit codes: 0 printed, 2 a shell other than bash, zsh or fish.
    """
    from click.shell_completion import get_completion_class

    from tpuctl.cli.app import cli

    kind = get_completion_class(shell) if shell in SHELLS else None
    if kind is None:
        raise InputError(
            f"tpuctl completion: {shell!r} is not a shell tpuctl completes", hint=did_you_mean(shell, SHELLS)
        )
    click.echo(kind(cli, {}, "tpuctl", COMPLETE_VAR).source())
