"""``tpuctl validate``: check a cluster spec and report every problem, without starting anything."""

from __future__ import annotations

from typing import Any

import click

from tpuctl.cli.output import dumps, emit, format_options
from tpuctl.errors import EXIT_INPUT, InputError
from tpuctl.spec.model import ClusterSpec, Problem, SpecCheck

SCHEMA = "tpuctl.validate/v1"


def cluster_summary(spec: ClusterSpec) -> dict[str, Any]:
    """The ``cluster`` part of ``validate --json``: what the spec resolves to."""
    tpu = spec.slice
    return {
        "name": spec.cluster,
        "accelerator": tpu.accelerator_type,
        "generation": tpu.generation.name,
        "topology": list(tpu.topology),
        "topology_name": tpu.topology_str,
        "num_slices": tpu.num_slices,
        "chips_per_host": tpu.chips_per_host,
        "num_hosts": tpu.num_hosts,
        "num_devices": tpu.num_devices,
        "device_kind": tpu.device_kind,
        "backend": spec.backend,
        "hosts": list(spec.hosts),
        "coordinator": spec.coordinator_target,
        "meshes": [{"name": m.name, "shape": dict(m.axes), "mode": m.mode} for m in spec.meshes],
        "output": spec.output,
    }


def _problem_json(problem: Problem) -> dict[str, Any]:
    return {
        "line": problem.line or None,
        "column": problem.column or None,
        "path": problem.path,
        "message": problem.message,
    }


def validate_document(path: str, check: SpecCheck) -> dict[str, Any]:
    """The one JSON document ``validate --json`` prints (keys: schema, ok, file, problems, cluster)."""
    return {
        "schema": SCHEMA,
        "ok": check.ok,
        "file": path,
        "problems": [_problem_json(p) for p in check.problems],
        "cluster": cluster_summary(check.spec) if check.spec is not None and check.ok else None,
    }


@click.command("validate")
@click.option("--config", "-c", "config", required=True, metavar="FILE", help="The cluster spec (YAML) to check.")
@format_options("text: ok, or every problem on stderr; json: one document (schema, ok, file, problems, cluster).")
@click.pass_context
def validate(ctx: click.Context, config: str, fmt: str) -> None:
    """Check a cluster spec and report every problem at once, with its line and column.

    \b
    tpuctl validate --config cluster.yaml
    tpuctl validate --config cluster.yaml --json      (or -o json, --format json)

    Exit codes: 0 valid, 2 problems found (each on stderr as FILE:LINE:COL: key: problem).
    """
    from tpuctl.spec.yamlfile import check_spec_file

    try:
        check = check_spec_file(config)
    except InputError as exc:
        if fmt != "json":
            raise
        problem = Problem(0, 0, "", f"{exc.message}" + (f"; {exc.hint}" if exc.hint else ""))
        check = SpecCheck(config, None, (problem,))
    if fmt == "json":
        emit(dumps(validate_document(config, check)), None)
    elif check.ok and check.spec is not None:
        click.echo(f"{config}: ok: {check.spec.describe()}")
    else:
        for line in check.formatted():
            click.echo(line, err=True)
        count = len(check.problems)
        click.echo(f"{config}: {count} problem{'s' if count != 1 else ''}", err=True)
    if not check.ok:
        ctx.exit(EXIT_INPUT)
