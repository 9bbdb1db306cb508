"""Entry point of a background agent process (``python -m tpuctl.agent_main``), started by ``tpuctl init``.

Not a user command: ``tpuctl init`` passes everything it resolved (spec file, task id, output, state dir)
and a pipe on which the agent reports progress and the outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from tpuctl.errors import TpuctlError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpuctl-agent")
    parser.add_argument("--config")
    parser.add_argument("--task-id", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--progress-fd", type=int, required=True)
    args = parser.parse_args(argv)

    from tpuctl.agent import Agent, PipeReporter, configure_logging
    from tpuctl.cli.init import build_options

    reporter = PipeReporter(os.fdopen(args.progress_fd, "w"))
    try:
        options = build_options(args.config, args.task_id, args.output, args.state_dir)
    except TpuctlError as exc:
        reporter.failed(exc)
        return exc.exit_code
    configure_logging(options.state.log_file)
    return asyncio.run(Agent(options, reporter).run())


if __name__ == "__main__":
    sys.exit(main())
