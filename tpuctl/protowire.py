"""Protobuf's wire format, the little tpuctl writes by hand: varints and length-delimited fields.

Two writers need raw wire bytes: the TopologyProto encoder (``tpu/topology.py``), which must not register
TensorFlow's descriptor, and the coordination service (``coordination/wire.py``), which joins answers
encoded once for every host to each host's own fields. Pure standard library, no I/O: core code may
import it.
"""

from __future__ import annotations

LENGTH_DELIMITED = 2
"""The wire type of bytes, strings, embedded messages and packed repeated fields."""


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint; a negative one as its 64-bit two's complement (ten bytes), as
    protobuf writes a negative int32 or int64."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def length_delimited(field: int, data: bytes) -> bytes:
    """``data`` (an encoded message, or packed values) as field ``field`` of an enclosing message."""
    return varint(field << 3 | LENGTH_DELIMITED) + varint(len(data)) + data
