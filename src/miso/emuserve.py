"""An emulated inference server: ``python -m miso.emuserve --model M``.

A real HTTP/1.1 process on ``$MISO_PORT`` (or ``--port``) that answers like an inference server
on its slice without a GPU, so the whole serving path (replica under the guard, router, load,
resizes) runs on a CPU machine:

* ``GET /ready`` is ``503`` while the model "loads" (the model's load time, ``--load-s``), then
  ``200``; ``GET /health`` is always ``200``;
* any other request is an inference: it waits in a FIFO queue; a batcher takes up to the
  model's maximum batch of the waiting requests at once (dynamic batching without a delay
  window) and answers them after the model's service time for that batch on this slice
  (the catalogue's latency model, :mod:`miso.serving.catalog`, slowed down ``--slowdown``
  times in throughput so that a CPU machine can drive it: :mod:`miso.serving.emulated`;
  ``--slowdown 1`` is the catalogue's speed). ``GET /ready`` says the slowdown, so the service
  manager reports the replica's capacity on its slice with the same model.

The slice comes from ``MISO_EMULATED_PROFILE`` / ``MISO_EMULATED_GPU_MODEL`` (set by the emulated
backend), else ``--profile`` / ``--gpu-model``. Fault switches for tests: ``--slow X`` multiplies
every service time, ``--never-ready`` never becomes ready.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any

from miso.serving import catalog, emulated
from miso.serving.http1 import BadRequest, json_response, read_http_request


class EmulatedServer:
    def __init__(self, model: str, gpu_model: str, profile: str, *, slow: float = 1.0,
                 load_s: float | None = None, never_ready: bool = False,
                 slowdown: float = emulated.DEFAULT_SLOWDOWN) -> None:
        self.lm: Any = catalog
        self.model, self.gpu_model, self.profile = model, gpu_model, profile
        self.max_batch = max(1, int(self.lm.max_batch(model, gpu_model, profile)))
        self.slowdown = min(max(1.0, float(slowdown)), emulated.MAX_SLOWDOWN)
        self.service_time_s(1)  # an unknown model fails here, before serving
        self.slow = slow
        self.load_s = float(self.lm.load_time_s(model)) if load_s is None else load_s
        self.never_ready = never_ready
        self.started = time.monotonic()
        self.queue: asyncio.Queue[asyncio.Future[float]] = asyncio.Queue()
        self.served = 0
        self.batches = 0

    def service_time_s(self, batch: int) -> float:
        return emulated.service_time_s(self.model, self.gpu_model, self.profile, batch,
                                       self.slowdown)

    def ready(self) -> bool:
        return not self.never_ready and time.monotonic() - self.started >= self.load_s

    async def batcher(self) -> None:
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.max_batch and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            t = self.service_time_s(len(batch)) * self.slow
            await asyncio.sleep(t)
            self.batches += 1
            for fut in batch:
                if not fut.done():
                    fut.set_result(t)
            self.served += len(batch)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    req = await read_http_request(reader)
                except BadRequest as e:
                    writer.write(json_response(e.status, {"error": str(e)}, False))
                    return
                if req is None:
                    return
                path = req.target.split(b"?", 1)[0]
                if path == b"/ready":
                    ok = self.ready()
                    out = json_response(200 if ok else 503, {
                        "ready": ok, "model": self.model, "profile": self.profile,
                        "gpu_model": self.gpu_model, "slowdown": self.slowdown},
                        req.keep_alive)
                elif path == b"/health":
                    out = json_response(200, {"ok": True, "pid": os.getpid(),
                                              "served": self.served,
                                              "batches": self.batches}, req.keep_alive)
                elif not self.ready():
                    out = json_response(503, {"error": "loading"}, req.keep_alive)
                else:
                    fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
                    t0 = time.monotonic()
                    await self.queue.put(fut)
                    service = await fut
                    out = json_response(200, {"model": self.model, "profile": self.profile,
                                              "service_ms": round(service * 1000, 3),
                                              "latency_ms": round(
                                                  (time.monotonic() - t0) * 1000, 3)},
                                        req.keep_alive)
                writer.write(out)
                await writer.drain()
                if not req.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()


async def _main(srv: EmulatedServer, host: str, port: int) -> None:
    server = await asyncio.start_server(srv.handle, host, port, backlog=2048)
    task = asyncio.create_task(srv.batcher())
    bound = server.sockets[0].getsockname()[1]
    print(json.dumps({"emuserve": srv.model, "profile": srv.profile, "port": bound,
                      "max_batch": srv.max_batch, "load_s": srv.load_s,
                      "slowdown": srv.slowdown}), flush=True)
    async with server:
        await server.serve_forever()
    task.cancel()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m miso.emuserve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=None, help="default: $MISO_PORT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--profile", default=None, help="default: $MISO_EMULATED_PROFILE or 7g.40gb")
    p.add_argument("--gpu-model", default=None,
                   help="default: $MISO_EMULATED_GPU_MODEL or A100-40GB")
    p.add_argument("--load-s", type=float, default=None, help="model load time (s)")
    p.add_argument("--slowdown", type=float, default=emulated.DEFAULT_SLOWDOWN,
                   help="throughput divisor of the emulated slice (1: the catalogue's speed; "
                   "default: %(default)g, see miso.serving.emulated)")
    p.add_argument("--slow", type=float, default=1.0, help="service-time multiplier (faults)")
    p.add_argument("--never-ready", action="store_true", help="never become ready (faults)")
    a = p.parse_args(argv)
    port = a.port if a.port is not None else int(os.environ.get("MISO_PORT", "0") or 0)
    profile = a.profile or os.environ.get("MISO_EMULATED_PROFILE") or "7g.40gb"
    gpu_model = a.gpu_model or os.environ.get("MISO_EMULATED_GPU_MODEL") or "A100-40GB"
    try:
        srv = EmulatedServer(a.model, gpu_model, profile, slow=a.slow, load_s=a.load_s,
                             never_ready=a.never_ready, slowdown=a.slowdown)
    except KeyError as e:
        print(f"emuserve: {e.args[0]}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(srv, a.host, port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
