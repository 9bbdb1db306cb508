"""``tpuctl init``: join this host to the cluster, merge core IDs, write the device mapping."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import click

from tpuctl.agent.coordinator import check_tls
from tpuctl.agent.launch import launch, refuse_if_running, run_foreground
from tpuctl.agent.options import build_options, observed
from tpuctl.agent.reporter import Reporter
from tpuctl.cli.common import WholeNumber, say, state_dir_option
from tpuctl.cli.output import dumps, format_options
from tpuctl.errors import TpuctlError


@click.command("init")
@click.option(
    "--config", "-c", metavar="FILE", help="Cluster spec (YAML). Without it, Cloud TPU / GKE variables make one."
)
@click.option(
    "--task-id",
    type=WholeNumber(min=0),
    help="This host's task id (else TPUCTL_TASK_ID, address match, TPU_WORKER_ID).",
)
@click.option(
    "--spare", is_flag=True,
    help="This host is one of the spec's spares: it stands by until a lost slice needs it (exit 2 if it is not).",
)  # fmt: skip
@click.option("--out", "out", metavar="FILE", help="Where to write the device mapping (default: the spec's output).")
@click.option("--foreground", is_flag=True, help="Stay attached (for systemd or Kubernetes); log to stderr.")
@click.option(
    "--metrics", metavar="ENDPOINT",
    help="Serve /metrics for Prometheus: PORT, ADDRESS:PORT, unix:PATH or off (else $TPUCTL_METRICS, the spec's metrics:).",
)  # fmt: skip
@click.option(
    "--log-format", type=click.Choice(["text", "json"]),
    help="The agent's log: text (default) or json, one object a line (else $TPUCTL_LOG_FORMAT, the spec's log_format).",
)  # fmt: skip
@format_options("text: a one-line summary; json: one document (schema tpuctl.init/v1).")
@state_dir_option
def init(
    config: str | None,
    task_id: int | None,
    spare: bool,
    out: str | None,
    foreground: bool,
    metrics: str | None,
    log_format: str | None,
    fmt: str,
    state_dir: str | None,
) -> int:
    """Join this host to the cluster and write the device mapping file.

    \b
    Run it on every host with the same spec:
      tpuctl init --config cluster.yaml
      tpuctl init --config cluster.yaml --task-id 2 --out /run/tpuctl/mapping.json -o json
    Task 0 starts the coordination service; every host registers, reports its TPU core IDs,
    and the merged topology is written to the mapping file on every host. stderr shows progress
    (naming the hosts still missing); stdout gets a one-line summary. The agent then stays in the
    background (heartbeats, error watch, `tpuctl barrier`) until `tpuctl down`.

    A spare (the spec's spares:, or --spare to insist on it) registers and stands by: init prints that
    it stands by and exits 0; its agent heartbeats and takes a lost slice's place when the cluster
    needs it (docs/how-to/elastic.md).

    Interrupted before the cluster formed (Ctrl-C, SIGTERM, SIGHUP), init stops this host's agent and
    says so; after, the agent stays (`tpuctl down` stops it).

    Exit codes: 0 up, 2 bad spec or TLS file (not PEM, encrypted, not its certificate's key), 3 cluster
    failure (also a TLS certificate refused for good: expired, not yet valid, another name or CA),
    4 a host never came (deadline), 5 already up or the state dir cannot be written (a full disk: every
    host is told), 128+N interrupted by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
    """
    if config:
        options = build_options(config, task_id, out, state_dir)
    else:  # detected: the environment, or a Cloud TPU VM's metadata server (tpuctl detect shows it)
        from tpuctl.cli.detect import detected_options

        options = detected_options(task_id, out, state_dir)
    if spare:
        from tpuctl.spec.detect import check_spare

        check_spare(options.spec, options.task)
    options = observed(options, metrics, log_format, os.environ)
    refuse_if_running(options.state)
    check_tls(options.spec, options.task)  # a certificate or key that cannot work: exit 2 before anything starts
    if foreground:
        return run_foreground(options, _StderrReporter(fmt, json_log=options.spec.log_format == "json"))
    summary = launch(options, say)
    _print_summary(summary, fmt)
    return 0


class _StderrReporter(Reporter):
    """``--foreground``: progress on stderr (a JSON log's line when the log is JSON, as stderr is the log),
    the summary on stdout as init would print it."""

    def __init__(self, fmt: str, *, json_log: bool = False) -> None:
        self.fmt = fmt
        self.json_log = json_log

    def progress(self, text: str) -> None:
        if self.json_log:
            logging.getLogger("tpuctl.agent.bringup").info("%s", text)
        else:
            say(text)

    def ready(self, summary: Mapping[str, object]) -> None:
        _print_summary(summary, self.fmt)

    def failed(self, exc: TpuctlError) -> None:
        pass  # raised to main(), which prints it


def _summary_line(summary: Mapping[str, object]) -> str:
    if summary.get("role") == "standby":
        return (
            f"tpuctl: cluster {summary.get('cluster')!r}: task {summary.get('task')} ({summary.get('address')}) standing "
            f"by in generation {summary.get('generation')}: it takes a lost slice's place when the cluster needs it; "
            f"agent pid {summary.get('pid')}"
        )
    return (
        f"tpuctl: cluster {summary.get('cluster')!r} up: task {summary.get('task')} of {summary.get('num_hosts')}, "
        f"{summary.get('accelerator')} ({summary.get('topology_name')}), {summary.get('num_local_devices')} local "
        f"of {summary.get('num_devices')} devices, mapping {summary.get('mapping')}, agent pid {summary.get('pid')}"
    )


def _print_summary(summary: Mapping[str, object], fmt: str) -> None:
    click.echo(dumps(summary) if fmt == "json" else _summary_line(summary), nl=fmt != "json")
