"""Device backends: where a host's TPU core ids come from.

``sim`` derives them from the slice model (no hardware); ``tensorflow`` and ``jax`` ask the real TPU
runtime through that framework, imported only when the backend is used.

* :mod:`tpuctl.backends.base`: ``Backend``, what a backend is;
* :mod:`tpuctl.backends.names`: the backends' names, shared with the spec;
* :mod:`tpuctl.backends.registry`: ``get_backend``, a backend by its name;
* :mod:`tpuctl.backends.probe`: a real backend asked in a short-lived child process.

Imports nothing eagerly.
"""
