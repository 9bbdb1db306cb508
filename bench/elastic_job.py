"""The job both sides of ``bench/elastic.py`` run: torch.distributed over gloo, an all-reduce a step.

It reads only torch's own variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``: torchrun
sets them, and so does ``tpuctl run``), appends ``started WORLD_SIZE EPOCH_SECONDS`` to ``$BENCH_LOG``
once the process group is up, then steps until killed or until ``$BENCH_STEPS`` steps. A checkpoint
(the step reached, in ``$BENCH_CKPT``, by rank 0) lets a restarted job resume where it was.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    log = Path(os.environ["BENCH_LOG"])
    ckpt = Path(os.environ["BENCH_CKPT"])
    steps = int(os.environ.get("BENCH_STEPS", "100000"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    world = dist.get_world_size()
    step = int(ckpt.read_text()) if ckpt.exists() else 0
    with log.open("a") as f:
        f.write(f"started {world} {time.time():.6f} {step}\n")
    value = torch.ones(4)
    while step < steps:
        dist.all_reduce(value)
        value.fill_(1.0)
        step += 1
        if dist.get_rank() == 0 and step % 10 == 0:
            tmp = ckpt.with_suffix(".tmp")
            tmp.write_text(str(step))
            tmp.replace(ckpt)
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
