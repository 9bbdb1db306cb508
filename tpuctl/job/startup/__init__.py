"""Put first on a job's ``PYTHONPATH`` by ``tpuctl run``: its ``sitecustomize`` installs the JAX cluster
detector (:mod:`tpuctl.job.jaxcluster`). Never imported as a package."""
