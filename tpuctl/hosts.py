"""Host names as tpuctl compares them: two spellings of one host (``Pod-A.`` and ``pod-a``, the long and
short forms of an IPv6 address) are one host.

Standard library only, no I/O: the spec model compares its hosts with it, and ``tpuctl env``'s agent side
counts the tasks on each machine with it.
"""

from __future__ import annotations

import ipaddress


def normalize_host(text: str) -> str:
    """The form two spellings of one host share: lowercase, no trailing dot, compressed IPv6."""
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        return text.lower().rstrip(".")
