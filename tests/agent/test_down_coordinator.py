"""``tpuctl down`` on task 0 while every host's session stream is open: its agent stops the coordination
service and exits, and its log has no traceback. Found by the soak (``tools/soak``, seeds 30000, 30028,
30049): grpc.aio's task for each open call outlived the server's stop by a loop turn; the agent's event
loop, ending right after, cancelled them, and grpc printed ``Traceback ... _schedule_rpc_coro ...
CancelledError`` for each into agent.log.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("policy", ["fail", "rejoin"])
def test_down_of_the_coordinator_with_open_streams_leaves_no_traceback_in_its_log(make_cluster, policy) -> None:
    extra = "restart: {policy: rejoin, timeout: 60s, max: 3}\n" if policy == "rejoin" else ""
    c = make_cluster("v4-32", heartbeat_timeout="3s", extra=extra)
    c.up()
    down = c.tpuctl("down", task=0, timeout=40)
    assert down.code == 0 and "stopped" in down.err, c.logs()
    log = (c.state(0) / "agent.log").read_text(errors="replace")
    assert "coordination service at" in log and " stopped" in log, log
    assert "Traceback" not in log and "CancelledError" not in log, log
