"""TPU hardware, pure: generation facts, the slice model (devices, hosts, wraparound) and DTensor's topology.

* :mod:`tpuctl.tpu.hardware`: one table of facts per TPU generation;
* :mod:`tpuctl.tpu.slice`: ``TpuSlice`` (devices, coordinates, host blocks) from an accelerator type;
* :mod:`tpuctl.tpu.topology`: core-ID merge checks, DTensor's ``Topology`` and its TopologyProto bytes.

Imports nothing eagerly; imports no grpc, yaml, click, asyncio and reads no environment.
"""
