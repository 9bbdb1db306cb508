"""The per-host agent ``tpuctl init`` leaves running, and how local commands reach it.

* :mod:`tpuctl.agent.bringup`: ``Agent``: register, merge core IDs, write the mapping, heartbeat, serve;
* :mod:`tpuctl.agent.control`: the local control socket (one JSON line each way);
* :mod:`tpuctl.agent.statedir`: the state dir (pid, socket, ``agent.json``) and how it is found.

Imports nothing eagerly: ``control`` and ``statedir`` are stdlib-only, for ``barrier`` / ``status`` / ``env``.
"""
