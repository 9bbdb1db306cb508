"""The job side: what a training job started under tpuctl sees and calls.

* :mod:`tpuctl.job.api`: ``tpuctl.load_mapping()`` and the DTensor / JAX helpers (no grpc, no click);
* :mod:`tpuctl.job.env`: the environment ``tpuctl env`` / ``tpuctl run`` hand a job;
* :mod:`tpuctl.job.runner`: ``tpuctl run``, the job under supervision (start, signals, stop, restarts);
* :mod:`tpuctl.job.watcher`: the thread that watches this host's agent for the running job;
* :mod:`tpuctl.job.orphans`: the subreaper and the reaping of what the job leaves behind;
* :mod:`tpuctl.job.rootcause`: the root-cause table ``tpuctl run`` prints when the cluster stops the job.

Imports nothing eagerly.
"""
