"""The job side: what a training job started under tpuctl sees and calls.

* ``tpuctl.job.progress(step)`` and ``tpuctl.job.checkpointed(step)``: the job's step reports to its own
  host's agent (:mod:`tpuctl.job.steps`; never block, never raise, cost about one ``socket.send``);
* ``tpuctl.job.should_checkpoint(step)``: True on every host at the same step after a preemption notice
  (:mod:`tpuctl.job.steps`; without a notice a lock taken and given back);
* :mod:`tpuctl.job.api`: ``tpuctl.load_mapping()`` and the DTensor / JAX helpers (no grpc, no click);
* :mod:`tpuctl.job.env`: the environment ``tpuctl env`` / ``tpuctl run`` hand a job;
* :mod:`tpuctl.job.runner`: ``tpuctl run``, the job under supervision (start, signals, stop, restarts);
* :mod:`tpuctl.job.watcher`: the thread that watches this host's agent for the running job;
* :mod:`tpuctl.job.orphans`: the subreaper and the reaping of what the job leaves behind;
* :mod:`tpuctl.job.rootcause`: the root-cause table ``tpuctl run`` prints when the cluster stops the job.

Imports nothing eagerly: ``progress``, ``checkpointed`` and ``should_checkpoint`` load :mod:`tpuctl.job.steps`
(standard library sockets only) on first use, and are then plain attributes of this package.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tpuctl.job.steps import checkpointed as checkpointed
    from tpuctl.job.steps import progress as progress
    from tpuctl.job.steps import should_checkpoint as should_checkpoint


def __getattr__(name: str) -> object:
    if name in ("progress", "checkpointed", "should_checkpoint"):
        from tpuctl.job import steps

        # later calls: no hook
        globals().update(progress=steps.progress, checkpointed=steps.checkpointed, should_checkpoint=steps.should_checkpoint)
        return getattr(steps, name)
    raise AttributeError(f"module 'tpuctl.job' has no attribute {name!r}")
