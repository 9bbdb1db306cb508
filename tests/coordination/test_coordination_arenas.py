"""The serving process caps glibc's malloc arenas (``server.limit_malloc_arenas``): threads that start
after it share the arenas that exist instead of each getting its own. Counted from glibc's own report
(``malloc_info``: one ``<heap>`` per arena), in a fresh Python process per case."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)

CHILD = r"""
import ctypes, os, re, sys, tempfile, threading
from tpuctl.coordination.server import limit_malloc_arenas

if sys.argv[1] == "capped":
    assert limit_malloc_arenas() is True

def allocate():
    blocks = [bytearray(64 * 1024) for _ in range(16)]  # through malloc (over pymalloc's 512 B, under mmap's 128 kB)
    done.wait()
    del blocks

done = threading.Event()
threads = [threading.Thread(target=allocate) for _ in range(6)]
for t in threads:
    t.start()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
path = os.path.join(tempfile.mkdtemp(), "info.xml")
stream = libc.fopen(path.encode(), b"w")
assert libc.malloc_info(0, stream) == 0
libc.fclose(stream)
done.set()
for t in threads:
    t.join()
print(len(re.findall(r'<heap nr="\d+">', open(path).read())))
"""


def arenas(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_threads_started_after_the_cap_share_one_arena() -> None:
    assert arenas("default") >= 4  # glibc's default: an arena per thread (up to 8 x cores)
    assert arenas("capped") == 1
