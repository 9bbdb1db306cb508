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


def with_tls_files(config: str, check: SpecCheck) -> SpecCheck:
    """``check`` with the problems of the spec's TLS files as this host has them (``tls.file_problems``:
    unreadable, not PEM, a key readable by others, encrypted, or not its certificate's; a CA that is a
    folder), each at the line of its key. A file not on this host is not checked."""
    spec = check.spec
    tls = spec.auth.tls if spec is not None and spec.auth is not None else None
    if tls is None or not check.ok:
        return check
    from tpuctl.coordination.tls import file_problems

    found = file_problems(tls.cert, tls.key, tls.ca, tls.client_cert, tls.client_key)
    if not found:
        return check
    where = _tls_positions(config)
    problems = tuple(Problem(*where.get(key, (0, 0)), key, message) for key, message in found)
    return SpecCheck(check.source, None, problems)


def _tls_positions(config: str) -> dict[str, tuple[int, int]]:
    """Where each ``auth.tls`` value is written in the spec file: dotted key -> (line, column)."""
    from tpuctl.spec.yamlfile import parse_tree, read_spec_file

    root, _ = parse_tree(read_spec_file(config).decode("utf-8-sig", errors="replace"))
    found: dict[str, tuple[int, int]] = {}
    node = root
    for name in ("auth", "tls"):
        node = next((v for k, v in node.entries if k.value == name), None) if node is not None else None
    for key, value in node.entries if node is not None else ():
        found[f"auth.tls.{key.value}"] = (value.line, value.column)
    return found


@click.command("validate")
@click.option("--config", "-c", "config", required=True, metavar="FILE", help="The cluster spec (YAML) to check.")
@format_options("text: ok, or every problem on stderr; json: one document (schema, ok, file, problems, cluster).")
@click.pass_context
def validate(ctx: click.Context, config: str, fmt: str) -> None:
    """Check a cluster spec and report every problem at once, with its line and column.

    \b
    tpuctl validate --config cluster.yaml
    tpuctl validate --config cluster.yaml --json      (or -o json, --format json)

    With auth.tls, the certificate and key files this host has are checked too, as init loads them: PEM
    that OpenSSL reads, a key owner-only (mode 600), not protected by a passphrase, and its certificate's.
    Files that are not on this host (task 0's certificate, on a worker) are not checked.

    Exit codes: 0 valid, 2 problems found (each on stderr as FILE:LINE:COL: key: problem).
    """
    from tpuctl.spec.yamlfile import check_spec_file

    try:
        check = with_tls_files(config, check_spec_file(config))
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
