"""``miso serve``, ``miso services`` and ``miso load``: inference services on the cluster.

    miso serve bars-svc --model resnet50 --slo-p99-ms 100 -- \
        python -m miso.emuserve --model resnet50
    miso services [--json]
    miso load URL --ramp 1,6,1 --duration 180 --json
    miso serve --stop bars-svc
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from miso.cli.client import StateDir, Token, TokenFile, Url, call, client
from miso.cli.text import fail, make_console

console = make_console()


def serve(
    name: Annotated[str | None, typer.Argument(help="Service name (its URL ends in it).")] = None,
    command: Annotated[list[str] | None, typer.Argument(
        help="The replica's command, after `--`: it serves HTTP on $MISO_PORT and answers "
        "GET /ready with 200 once it can serve.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Catalogue model.")] = None,
    slo_p99_ms: Annotated[float | None, typer.Option(
        "--slo-p99-ms", help="Latency SLO: p99 in ms.")] = None,
    min_replicas: Annotated[int, typer.Option(
        "--min-replicas", help="Replicas kept however low the request rate.")] = 1,
    max_replicas: Annotated[int, typer.Option(
        "--max-replicas", help="Replicas at most however high the request rate.")] = 8,
    memory_gb: Annotated[float | None, typer.Option(
        "--memory-gb", help="GPU memory of one replica in GB (its slice is at least this).")]
    = None,
    headroom: Annotated[float, typer.Option(
        "--headroom", help="Capacity kept above the observed rate (0.2 = 20 %).")] = 0.2,
    stop: Annotated[str | None, typer.Option(
        "--stop", help="Stop this service: drain its replicas and remove it.")] = None,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Start an inference service (or --stop one); prints its URL."""
    if stop is not None:
        with client(url, token, state_dir, token_file=token_file) as c:
            out = call(c.request, "DELETE", f"/services/{stop}")
        console.print(f"stopped {out['name']}: its replicas drain and stop")
        return
    if name is None or not command or model is None or slo_p99_ms is None:
        fail("usage: miso serve NAME --model M --slo-p99-ms MS [--min-replicas 1 "
             "--max-replicas 8 --memory-gb G] -- COMMAND...  (or miso serve --stop NAME)")
    body: dict[str, Any] = {"name": name, "model": model, "slo_p99_ms": slo_p99_ms,
                            "command": list(command), "min_replicas": min_replicas,
                            "max_replicas": max_replicas, "headroom": headroom,
                            "cwd": os.getcwd()}
    if memory_gb is not None:
        body["memory_gb"] = memory_gb
    with client(url, token, state_dir, token_file=token_file) as c:
        out = call(c.request, "POST", "/services", json=body)
    console.print(out["url"])


def services(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Services: URL, rate, replicas and slices, p50/p99 vs SLO, attainment (5 min)."""
    with client(url, token, state_dir, token_file=token_file) as c:
        out = call(c.request, "GET", "/services")
    if as_json:
        print(json.dumps(out, indent=2))
        return
    t = Table("name", "url", "ready", "slices", "rate/s", "p50 ms", "p99 ms", "SLO ms",
              "attain", "why")
    for s in out["services"]:
        t.add_row(s["name"], s["url"], f"{s['ready_replicas']}/{len(s['replicas'])}",
                  ",".join(s["slices"]) or "-", f"{s['rate']:.1f}", _ms(s["p50_ms"]),
                  _ms(s["p99_ms"]), f"{s['slo_p99_ms']:g}",
                  "-" if s["attainment"] is None else f"{100 * s['attainment']:.1f}%",
                  s["why"])
    console.print(t)
    o = out.get("others") or {}
    if o.get("services"):
        console.print(f"other owners: {o['services']} services, {o['replicas']} replicas")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def load(
    target: Annotated[str, typer.Argument(
        help="Service URL (from `miso services`), or the name of one of your services.")],
    trace: Annotated[str | None, typer.Option(
        "--trace", help="Arrivals from a trace: Azure LLM CSV (TIMESTAMP) or timestamp[,size] "
        "CSV/JSONL in seconds.")] = None,
    rate_x: Annotated[float, typer.Option("--rate-x", help="Speed the trace up K times.")]
    = 1.0,
    ramp: Annotated[str | None, typer.Option(
        "--ramp", help="Rates through the run in multiples of one replica's capacity on the "
        "service's current slice, e.g. 1,6,1.")] = None,
    rate: Annotated[float | None, typer.Option(
        "--rate", help="Requests/s of 1x in --ramp (default: the service's capacity).")]
    = None,
    duration: Annotated[float, typer.Option("--duration", help="Seconds (--ramp).")] = 60.0,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Most requests in flight.")]
    = 512,
    slo_ms: Annotated[float | None, typer.Option("--slo-ms", help="default: the service's")]
    = None,
    plot_path: Annotated[str | None, typer.Option("--plot", help="Write the plot (PNG).")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
    = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Open-loop load at a service URL; a summary (and --plot, latency over time)."""
    from miso import loadgen

    if (trace is None) == (ramp is None):
        fail("give one of --trace FILE or --ramp A,B,...")
    svc: dict[str, Any] | None = None
    c = None
    if rate is None or slo_ms is None or ramp is not None:
        try:
            c = client(url, token, state_dir, token_file=token_file)
            listing = c.request("GET", "/services")
            svc = next((s for s in listing["services"]
                        if s["url"].rstrip("/") == target.rstrip("/") or s["name"] == target),
                       None)
        except (SystemExit, typer.Exit, Exception):  # noqa: BLE001 - a bare URL works too
            c, svc = None, None
    if not target.startswith("http://"):
        if svc is None:
            fail(f"{target}: not a URL, and no service of yours has that name")
        target = svc["url"]
    if slo_ms is None and svc is not None:
        slo_ms = float(svc["slo_p99_ms"])
    if trace is not None:
        try:
            arrivals = loadgen.read_trace(trace, rate_x)
        except (OSError, ValueError, KeyError) as e:
            fail(f"--trace {trace}: {e}")
    else:
        try:
            points = [float(x) for x in (ramp or "").split(",") if x.strip()]
        except ValueError:
            fail(f"--ramp {ramp}: expected numbers like 1,6,1")
        base = rate if rate is not None else (float(svc["capacity_rps"]) if svc else None)
        if not base or not points or min(points) < 0:
            fail("--ramp needs the service's capacity (a URL `miso services` lists) or --rate")
        arrivals = loadgen.ramp_arrivals(points, base, duration)
    name = svc["name"] if svc else None
    res_holder: dict[str, Any] = {}

    def tick(t: float) -> None:
        if c is None or name is None:
            return
        s = c.request("GET", f"/services/{name}")
        res_holder.setdefault("replicas", []).append((t, int(s["ready_replicas"])))

    res = asyncio.run(loadgen.run_load(target, arrivals, concurrency=concurrency,
                                       on_tick=tick if c is not None else None,
                                       end_s=duration + 5.0 if ramp else None))
    res.replicas = res_holder.get("replicas", [])
    out = loadgen.summarize(res, slo_ms)
    out["url"], out["generated_at"] = target, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if plot_path:
        loadgen.plot(res, plot_path, slo_ms)
        out["plot"] = plot_path
    if as_json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            console.print(f"{k}: {v}")
