"""The job side: what a training job started under tpuctl sees and calls.

* :mod:`tpuctl.job.api`: ``tpuctl.load_mapping()`` and the DTensor / JAX helpers (no grpc, no click);
* :mod:`tpuctl.job.env`: the environment ``tpuctl env`` / ``tpuctl run`` hand a job.

Imports nothing eagerly.
"""
