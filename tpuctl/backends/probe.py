"""Ask a real-TPU backend for this host's core IDs in a short-lived child process.

The agent lives as long as the cluster; if it imported jax or tensorflow and touched the TPU itself,
it would hold the chips and the job could not open them. So ``tpuctl init`` runs the backend here,
in a child that prints one JSON line and exits, releasing the TPU.

    python -m tpuctl.backends.probe BACKEND TASK GENERATION TOPOLOGY TASK_BLOCK MACHINE_BLOCK NUM_SLICES MEGACORE KIND
    -> {"core_ids": [...]}   or   {"error": {"type": "NoTpuError", "message": ..., "hint": ..., "exit_code": 6}}
"""

from __future__ import annotations

import asyncio
import json
import sys

from tpuctl.errors import TpuctlError, error_payload
from tpuctl.tpu.slice import TpuSlice, resolve_slice, with_blocks

PROBE_TIMEOUT_S = 300.0  # TPU runtime initialisation can take minutes on a large host


def _block(block: tuple[int, int, int]) -> str:
    return ",".join(str(d) for d in block)


def _parse_block(text: str) -> tuple[int, int, int]:
    x, y, z = (int(d) for d in text.split(","))
    return (x, y, z)


def probe_args(backend: str, task: int, tpu: TpuSlice) -> list[str]:
    return [
        backend,
        str(task),
        tpu.generation.name,
        tpu.topology_str,
        _block(tpu.chips_per_host_bounds),
        _block(tpu.machine_block),
        str(tpu.num_slices),
        "1" if tpu.megacore else "0",
        tpu.device_kind,
    ]


async def probe_core_ids(backend: str, task: int, tpu: TpuSlice, *, timeout: float = PROBE_TIMEOUT_S) -> list[int]:
    """Run the probe child and return its core IDs, or raise the error it reported."""
    from tpuctl.errors import DeadlineError, StateError, error_from_payload

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tpuctl.backends.probe", *probe_args(backend, task, tpu),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise DeadlineError(
            f"task {task}: backend {backend} did not report this host's TPU cores within {timeout:.0f} s"
        ) from None
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    if not lines:
        raise StateError(
            f"task {task}: the {backend} backend probe exited with code {proc.returncode} and no answer",
            hint="its stderr ends with: " + err.decode(errors="replace")[-500:],
        )
    answer = json.loads(lines[-1])
    if "error" in answer:
        raise error_from_payload(answer["error"])
    return [int(i) for i in answer["core_ids"]]


def main(argv: list[str]) -> int:
    from tpuctl.backends.registry import get_backend

    backend, task, generation, topology, task_block, machine_block, num_slices, megacore, kind = argv
    try:
        block, machine = _parse_block(task_block), _parse_block(machine_block)
        tpu = resolve_slice(
            generation=generation,
            topology=topology,
            chips_per_host=machine[0] * machine[1] * machine[2] if block == machine else None,
            num_slices=int(num_slices),
            megacore=megacore == "1",
            device_kind=kind,
        )
        tpu = with_blocks(tpu, block, machine)
        ids = get_backend(backend, tpu).local_core_ids(int(task))
    except TpuctlError as exc:
        print(json.dumps({"error": error_payload(exc)}), flush=True)
        return exc.exit_code
    print(json.dumps({"core_ids": [int(i) for i in ids]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["probe_args", "probe_core_ids"]
