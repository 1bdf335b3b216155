"""``python -m miso.serving.runreplica --port P -- COMMAND...``: one replica of a service, run as a
job by the agent (under the guard, as the owner's account, on its slice).

It runs COMMAND with ``MISO_PORT=P`` (the port the router reaches the replica on; the agent
does not pass ``MISO_*`` variables of a submission on, so the port comes as an argument) and
tells miso through the job helper that it cannot checkpoint (a replica holds no progress: miso
never moves it once it runs; a resize is make-before-break, by the service manager).
Signals are passed to COMMAND; its exit code is this process's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from miso import job


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m miso.serving.runreplica")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or not 0 < a.port < 65536:
        p.error("usage: --port P -- COMMAND...")
    ctx = job.context()
    if ctx.managed:
        ctx.started(0, None, checkpointable=False)
    env = dict(os.environ, MISO_PORT=str(a.port))
    proc = subprocess.Popen(cmd, env=env)

    def forward(sig: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = proc.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
