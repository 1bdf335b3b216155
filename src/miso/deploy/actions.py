"""miso's Ray-side steps that a node owner runs in a short child process, so that a Ray going
away under it (scancel, a stopping node) costs a timeout, never a hung owner:

``python -m miso.deploy.actions drain ADDRESS TIMEOUT``  halt the controller, have every job
save and exit, stop the agents and the controller;
``python -m miso.deploy.actions agents ADDRESS BACKEND_JSON WORKDIR [HOST]``  make sure every
agent node runs its miso agent (a node that joined after ``cluster up``); with ``HOST``, first
wait (up to 5 minutes) for the Ray node of that host name to have joined.

Both need Ray's token in the environment (``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN_PATH``).
"""

from __future__ import annotations

import json
import sys
import time


def drain(address: str, timeout: float) -> int:
    from miso import raycluster as rc  # noqa: PLC0415

    rc.connect(address)
    left = rc.checkpoint_jobs(timeout)
    rc.stop_actors(stop_jobs=True)
    print(f"miso: jobs saved and stopped ({left} did not save in {timeout:g}s, killed)"
          if left else "miso: every job saved and stopped", flush=True)
    return 0


def agents(address: str, backend: dict[str, object], workdir: str,
           host: str | None = None, timeout: float = 300.0) -> int:
    from miso import raycluster as rc  # noqa: PLC0415

    rc.connect(address)
    deadline = time.time() + timeout
    while host and not any(rc.agent_name(n) == host.split(".")[0] for n in rc.agent_nodes()):
        if time.time() > deadline:
            print(f"miso: no Ray node of host {host} joined within {timeout:.0f}s",
                  file=sys.stderr, flush=True)
            return 1
        time.sleep(1.0)
    nodes = rc.start_agents(backend, workdir)
    print(f"miso: agents on {', '.join(nodes) or 'no node'}", flush=True)
    return 0 if nodes else 1


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "drain":
        return drain(argv[1], float(argv[2]))
    if len(argv) in (4, 5) and argv[0] == "agents":
        spec = json.loads(argv[2])
        if not isinstance(spec, dict):
            raise SystemExit("BACKEND_JSON must be an object")
        return agents(argv[1], spec, argv[3], argv[4] if len(argv) == 5 else None)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
