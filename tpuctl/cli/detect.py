"""``tpuctl detect``: the spec ``tpuctl init`` would use without ``--config``, and where each value came from."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tpuctl.cli.common import WholeNumber
from tpuctl.cli.output import dumps, emit, format_options
from tpuctl.errors import TpuctlError

if TYPE_CHECKING:
    from tpuctl.agent.options import AgentOptions
    from tpuctl.spec.detect import Detection, TaskIdentity

SCHEMA = "tpuctl.detect/v1"


def detected_options(task_id: int | None, output: str | None, state_dir: str | None) -> AgentOptions:
    """``tpuctl init`` without ``--config``: the detected spec (metadata server included), this host's task,
    the output path and the state dir, as :func:`tpuctl.agent.options.build_options` resolves them for a file."""
    from tpuctl.agent.options import AgentOptions
    from tpuctl.agent.statedir import resolve_state_dir
    from tpuctl.spec import hostenv
    from tpuctl.spec.detect import resolve_task_id

    found = hostenv.detect_cluster()
    spec = found.spec
    task = resolve_task_id(spec, task_id=task_id, environ=found.values, local_names=hostenv.local_names())
    return AgentOptions(
        spec=spec,
        task=task,
        state=resolve_state_dir(state_dir),
        output=Path(output or spec.output).absolute(),
        address=spec.hosts[task],
        config_path=None,
    )


def _task(found: Detection, task_id: int | None) -> tuple[TaskIdentity | None, str | None]:
    from tpuctl.spec import hostenv
    from tpuctl.spec.detect import identify

    try:
        return identify(found.spec, task_id=task_id, environ=found.values, local_names=hostenv.local_names()), None
    except TpuctlError as exc:
        return None, exc.message + (f" ({exc.hint})" if exc.hint else "")


def document(found: Detection, task: TaskIdentity | None, task_problem: str | None) -> dict[str, Any]:
    """The ``--format json`` document: schema, platform, sources [{key, value, source}], task (this host's
    id, an integer as in every document), task_reason, task_problem, notes; the tasks' layout (tasks,
    chips_per_task, tasks_per_machine, machines) and this task's chips (task_chips: [x, y, z] each;
    visible_chips: their numbers on its machine, as TPU_VISIBLE_CHIPS spells them)."""
    spec = found.spec
    tpu = spec.slice
    mine = tpu.devices_of_task(task.task_id) if task is not None else ()
    return {
        "schema": SCHEMA,
        "platform": found.platform,
        "cluster": spec.cluster,
        "accelerator": spec.slice.accelerator_type,
        "hosts": list(spec.hosts),
        "coordinator": spec.coordinator_target,
        "sources": [{"key": s.key, "value": s.value, "source": s.origin} for s in found.sources],
        "task": None if task is None else task.task_id,
        "task_reason": None if task is None else task.reason,
        "task_problem": task_problem,
        "notes": list(found.notes),
        "tasks": tpu.num_hosts,
        "chips_per_task": tpu.chips_per_host,
        "tasks_per_machine": tpu.tasks_per_machine,
        "machines": tpu.num_machines,
        "task_chips": [list(c) for c in dict.fromkeys(d.coords for d in mine)] if task is not None else None,
        "visible_chips": list(tpu.visible_chips(task.task_id)) if task is not None else None,
    }


def _text(found: Detection, task: TaskIdentity | None, task_problem: str | None) -> str:
    rows = [(s.key, s.value or "-", s.origin) for s in found.sources]
    rows.append(("task", str(task.task_id) if task else "?", task.reason if task else (task_problem or "")))
    tpu = found.spec.slice
    if task is not None and tpu.tasks_per_machine > 1:
        chips = ",".join(map(str, tpu.visible_chips(task.task_id)))
        where = f"on machine {tpu.machine_of(task.task_id)} ({tpu.chips_per_host} of its chips)"
        rows.append(("task_chips", chips, where))
    width_key = max(len(r[0]) for r in rows)
    width_value = min(40, max(len(r[1]) for r in rows))
    lines = [f"detected: {found.platform}", f"spec: {found.spec.describe()}", ""]
    lines += [f"{key:<{width_key}}  {value:<{width_value}}  {origin}" for key, value, origin in rows]
    lines += [f"note: {note}" for note in found.notes]
    return "\n".join(lines)


@click.command("detect")
@format_options("text: one line per value with its source; json: one document (schema tpuctl.detect/v1).")
@click.option("--task-id", type=WholeNumber(min=0), help="As for `tpuctl init`: this host's task id.")
def detect(fmt: str, task_id: int | None) -> int:
    """Show the cluster spec `tpuctl init` builds without --config, and where every value came from.

    \b
    Order (first found wins; see "Detection (no spec file)" in the docs, reference/detection.md):
      1. TPUCTL_HOSTS, TPU_PROCESS_ADDRESSES or TPU_WORKER_HOSTNAMES in the environment (GKE, JobSet,
         LeaderWorkerSet): the metadata server is not asked;
      2. the GCE metadata server of a Cloud TPU VM (agent-worker-number, worker-network-endpoints,
         accelerator-type, tpu-env), unless TPU_SKIP_MDS_QUERY is set; a variable in the environment
         wins over the metadata value. GCE_METADATA_HOST=HOST:PORT (or GCE_METADATA_IP) names the server.
    Several TPU processes per machine (TPU_PROCESS_BOUNDS, TPU_CHIPS_PER_PROCESS_BOUNDS): a task per process;
    the json document gives tasks, chips_per_task, tasks_per_machine, and this task's chips.
    \b
      tpuctl detect                 # on a TPU VM or in a GKE pod: what init would use, and why
      tpuctl detect -o json | jq .sources
    Nothing is started. Exit codes: 0 detected, 2 nothing (or something malformed) to detect from.
    """
    from tpuctl.spec import hostenv

    found = hostenv.detect_cluster()
    task, task_problem = _task(found, task_id)
    if fmt == "json":
        emit(dumps(document(found, task, task_problem)), None)
    else:
        click.echo(_text(found, task, task_problem))
    return 0
