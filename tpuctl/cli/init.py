"""``tpuctl init``: join this host to the cluster, merge core IDs, write the device mapping."""

from __future__ import annotations

import json
from typing import Any

import click

from tpuctl.agent.launch import build_options, launch, refuse_if_running, run_foreground
from tpuctl.agent.reporter import Reporter
from tpuctl.cli.common import say, state_dir_option
from tpuctl.errors import TpuctlError


@click.command("init")
@click.option(
    "--config", "-c", metavar="FILE", help="Cluster spec (YAML). Without it, Cloud TPU / GKE variables make one."
)
@click.option(
    "--task-id",
    type=click.IntRange(min=0),
    help="This host's task id (else TPUCTL_TASK_ID, address match, TPU_WORKER_ID).",
)
@click.option("--output", "-o", metavar="PATH", help="Where to write the device mapping (default: the spec's output).")
@click.option("--foreground", is_flag=True, help="Stay attached (for systemd or Kubernetes); log to stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON document.")
@state_dir_option
def init(
    config: str | None, task_id: int | None, output: str | None, foreground: bool, as_json: bool, state_dir: str | None
) -> int:
    """Join this host to the cluster and write the device mapping file.

    \b
    Run it on every host with the same spec:
      tpuctl init --config cluster.yaml
    Task 0 starts the coordination service; every host registers, reports its TPU core IDs,
    and the merged topology is written to the mapping file on every host. stderr shows progress
    (naming the hosts still missing); stdout gets a one-line summary. The agent then stays in the
    background (heartbeats, error watch, `tpuctl barrier`) until `tpuctl down`.

    Exit codes: 0 up, 2 bad spec, 3 cluster failure, 4 a host never came (deadline), 5 already up.
    """
    if config:
        options = build_options(config, task_id, output, state_dir)
    else:  # detected: the environment, or a Cloud TPU VM's metadata server (tpuctl detect shows it)
        from tpuctl.cli.detect import detected_options

        options = detected_options(task_id, output, state_dir)
    refuse_if_running(options.state)
    if foreground:
        return run_foreground(options, _StderrReporter(as_json))
    summary = launch(options, say)
    _print_summary(summary, as_json)
    return 0


class _StderrReporter(Reporter):
    """``--foreground``: progress on stderr, the summary on stdout as init would print it."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def progress(self, text: str) -> None:
        say(text)

    def ready(self, summary: dict[str, Any]) -> None:
        _print_summary(summary, self.as_json)

    def failed(self, exc: TpuctlError) -> None:
        pass  # raised to main(), which prints it


def _summary_line(summary: dict[str, Any]) -> str:
    return (
        f"tpuctl: cluster {summary.get('cluster')!r} up: task {summary.get('task')} of {summary.get('tasks')}, "
        f"{summary.get('accelerator')} ({summary.get('topology')}), {summary.get('local_devices')} local of "
        f"{summary.get('devices')} devices, mapping {summary.get('mapping')}, agent pid {summary.get('pid')}"
    )


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        click.echo(_summary_line(summary))
