"""``tpuctl init`` relays its agent's events and never waits past its deadline, even on a silent agent."""

from __future__ import annotations

import os
import time

from tpuctl.agent.launch import _events


def test_events_stop_at_the_deadline_when_the_agent_goes_silent() -> None:
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b'{"event": "progress", "text": "a"}\n{"event": "progr')  # then nothing more
        started = time.monotonic()
        events = list(_events(read_fd, time.monotonic() + 0.3))
        waited = time.monotonic() - started
    finally:
        os.close(write_fd)
    assert events == [{"event": "progress", "text": "a"}]
    assert 0.25 <= waited < 2.0


def test_events_end_when_the_agent_closes_the_pipe() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b'{"event": "ready", "summary": {"task": 1}}\n')
    os.close(write_fd)
    started = time.monotonic()
    assert list(_events(read_fd, time.monotonic() + 30)) == [{"event": "ready", "summary": {"task": 1}}]
    assert time.monotonic() - started < 2.0
