"""The emulated cluster in one process: agents over emulated GPUs (or fake agents) reached by
the in-process transport (:class:`miso.transport.inprocess.LocalTransport`), and a controller.

Used by tests, benchmarks and ``miso demo --no-ray``. Job processes are still real processes,
unless the cluster is made of fake agents (``fake=True``: :mod:`miso.agent.fakeagent`, jobs as
timers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miso.agent import Agent
from miso.agent.fakeagent import FakeAgent
from miso.backend import EmulatedBackend
from miso.controller.controller import Controller, ControllerConfig
from miso.controller.storefile import open_store
from miso.transport.inprocess import LocalTransport


class LocalCluster:
    """``nodes`` nodes with ``gpus_per_node`` emulated GPUs each, a store under ``state_dir``."""

    def __init__(self, state_dir: str | Path, *, nodes: int = 1, gpus_per_node: int = 4,
                 model: str = "A100-40GB", config: ControllerConfig | None = None,
                 rate_window: float = 1.0, change_threshold: float = 0.25,
                 start: bool = True, fake: bool = False) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config or ControllerConfig()
        self.model = model
        self.rate_window = rate_window
        self.change_threshold = change_threshold
        self.transport = LocalTransport()
        self.fake = fake
        self.backends: dict[str, EmulatedBackend] = {}
        for i in range(nodes):
            self.add_node(f"node{i}", gpus_per_node)
        self.controller: Controller | None = None
        if start:
            self.start_controller()

    def add_node(self, node: str, gpus: int) -> Agent:
        if self.fake:
            fake = FakeAgent(node, gpus, self.model, rate_window=self.rate_window,
                             change_threshold=self.change_threshold)
            self.backends[node] = fake.backend
            self.transport.add(fake)  # type: ignore[arg-type] - the same calls
            return fake  # type: ignore[return-value]
        be = EmulatedBackend(gpus, self.model, node=node)
        self.backends[node] = be
        agent = Agent(node, be, self.dir / "agents" / node, rate_window=self.rate_window,
                      change_threshold=self.change_threshold)
        self.transport.add(agent)
        return agent

    def start_controller(self) -> Controller:
        store = open_store(self.dir)
        ctl = Controller(store, self.transport, self.config,
                         checkpoint_root=self.dir / "checkpoints")
        try:
            ctl.start()
        except BaseException:
            store.close()
            raise
        self.controller = ctl
        return ctl

    def crash_controller(self) -> None:
        """Drop the controller without any clean-up (threads stop, agents and jobs go on)."""
        if self.controller is not None:
            self.controller.stop()
            self.controller.store.close()
            self.controller = None

    def submit(self, *args: Any, **kw: Any) -> str:
        assert self.controller is not None
        return self.controller.submit(*args, **kw)

    def close(self) -> None:
        """Stop the controller and kill every job process of every node."""
        if self.controller is not None:
            self.controller.stop()
            self.controller.store.close()
            self.controller = None
        for agent in self.transport.agents().values():
            agent.shutdown()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
