"""The per-host agent ``tpuctl init`` leaves running, and how local commands reach it.

* :mod:`tpuctl.agent.bringup`: ``Agent``: register, merge core IDs, write the mapping, heartbeat, serve, re-form;
* :mod:`tpuctl.agent.options`: ``AgentOptions``, what the agent is asked to be, and ``build_options``;
* :mod:`tpuctl.agent.generation`: one generation's record (``Generation``), how it ended (``GenerationEnd``,
  ``failure_end``) and the history it leaves (``HistoryRow``);
* :mod:`tpuctl.agent.coordinator`: the spec's token, task 0's coordination service, every host's client;
* :mod:`tpuctl.agent.merge`: the core-ID merge (this host's core IDs, one record per host, one gather);
* :mod:`tpuctl.agent.commands`: the answers to local commands, over the ``ServedAgent`` protocol;
* :mod:`tpuctl.agent.launch`: starting the agent (fork, event pipe, deadlines), or running it attached;
* :mod:`tpuctl.agent.reporter`: the agent's progress events to ``init``;
* :mod:`tpuctl.agent.protocol`: the typed, versioned messages (``AgentInfo``, ``ErrorReport``, ...);
* :mod:`tpuctl.agent.control`: the local control socket's client side (one JSON line each way);
* :mod:`tpuctl.agent.controlserver`: the agent's side of that socket;
* :mod:`tpuctl.agent.statedir`: the state dir (pid, socket, ``agent.json``) and how it is found.

Imports nothing eagerly: ``control``, ``protocol`` and ``statedir`` are stdlib-only, for ``barrier`` /
``status`` / ``env``.
"""
