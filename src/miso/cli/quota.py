"""``miso quota set|show``: owners' fair-share weights and quotas (admin only, through the API).

An owner is an API user (``miso user add``). ``set`` changes only the options given (``none``
clears one: the default weight 1, no limit); the running controller uses them at its next
decision, and they are kept in the cluster's store across restarts. See docs/api.md
(Tenancy) for what each one does.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import typer
from rich.table import Table

from miso.cli.client import StateDir, Token, TokenFile, Url, call, client
from miso.cli.text import fail, make_console, safe

quota_app = typer.Typer(help="Owners' fair-share weights and quotas (admin only).",
                        no_args_is_help=True)
console = make_console()
CLEAR = ("none", "-")


def _number(v: str | None, flag: str, *, integer: bool = False, positive: bool = False
            ) -> tuple[bool, Any]:
    """(given, value) of a ``--flag`` value: a number, or ``none`` (clear: value None)."""
    if v is None:
        return False, None
    if v.strip().lower() in CLEAR:
        return True, None
    try:
        x: float | int = int(v) if integer else float(v)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        fail(f"{flag} {v!r}: expected {kind}, or 'none' to clear it")
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        fail(f"{flag} {v!r}: expected a {'positive' if positive else 'non-negative'} "
             f"finite number, or 'none' to clear it")
    return True, x


def _row(q: dict[str, Any]) -> list[str]:
    def f(v: Any, unit: str = "") -> str:
        return "-" if v is None else f"{v:g}{unit}" if isinstance(v, float) else f"{v}{unit}"

    return [str(q.get("owner") or q.get("name") or "?"), f(q.get("weight")),
            f(q.get("max_in_use")), f(q.get("max_queued")),
            priority_words(q.get("priority_limit"))]


def priority_words(p: Any) -> str:
    """A priority as a user wrote it: a class name (high 100, normal 0, low -100) when it is
    one, else the number."""
    from miso.sched.tenancyconfig import PRIORITY_CLASSES

    if p is None:
        return "-"
    name = next((k for k, v in PRIORITY_CLASSES.items() if v == p), None)
    return f"{name} ({p})" if name else str(p)


def _tenancy_line(t: dict[str, Any]) -> str:
    if not t:
        return ""
    if not t.get("on"):
        return ("tenancy is off on this cluster (one FIFO queue): the queued-jobs quota applies "
                "now; weights and in-use quotas from a start with --fair-share or with quotas "
                "stored")
    if not t.get("live", True):
        return ("tenancy turns on at the controller's next start (quotas stored); the "
                "queued-jobs quota applies now")
    price = t.get("fairness_price")
    fs = (f"fair share on (half-life {t.get('half_life_s', 0):g} s"
          + (f", fairness price {100 * price:g} %" if price is not None else "") + ")"
          if t.get("fair_share") else "fair share off (FIFO within priorities)")
    pre = f", preemption on (min run {t.get('min_run_s', 0):g} s)" if t.get("preempt") else ""
    return f"tenancy on: {fs}{pre}"


@quota_app.command("set")
def set_quota(
    owner: Annotated[str, typer.Argument(help="The user (as `miso user list` names it).")],
    weight: Annotated[str | None, typer.Option(
        "--weight", help="Fair-share weight (entitlement; default 1): an owner with weight 2 "
        "is entitled to twice the GPU time of one with 1.")] = None,
    max_in_use: Annotated[str | None, typer.Option(
        "--max-in-use", help="Most GPU-equivalents the owner's jobs hold at once (a 3g slice "
        "of an A100 is 3/7); more of its jobs wait, and `miso status` says why.")] = None,
    max_queued: Annotated[str | None, typer.Option(
        "--max-queued", help="Most jobs the owner may have queued; a submission over it is "
        "refused with one line (HTTP 429).")] = None,
    priority_limit: Annotated[str | None, typer.Option(
        "--priority-limit", help="Highest --priority the owner may submit with (high, "
        "normal, low or an integer; default normal; admins: any).")] = None,
    max_time: Annotated[str | None, typer.Option(
        "--max-time", help="Longest time limit the owner's jobs may ask for, and their "
        "default (Slurm's formats: MM, HH:MM:SS, D-HH:MM:SS, ...).")] = None,
    account: Annotated[str | None, typer.Option(
        "--account", help="The account the owner is in (`miso quota account` sets its "
        "weight): fair share goes between accounts first, then between the owners of one "
        "(Slurm's association tree); `none`: in no account.")] = None,
    reset: Annotated[bool, typer.Option(
        "--reset", help="Clear every weight and quota of the owner (defaults again).")]
    = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the API's answer (JSON).")]
    = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Set an owner's weight and quotas (admin only); `none` clears one option."""
    fields: dict[str, Any] = {}
    for name, v, kw in (("weight", weight, {"positive": True}), ("max_in_use", max_in_use, {}),
                        ("max_queued", max_queued, {"integer": True})):
        given, x = _number(v, "--" + name.replace("_", "-"), **kw)
        if given:
            fields[name] = x
    if priority_limit is not None:
        p = priority_limit.strip()
        fields["priority_limit"] = None if p.lower() in CLEAR else (
            int(p) if p.lstrip("+-").isdigit() else p)
    if max_time is not None:
        from miso.timelimit import parse_time

        try:
            fields["max_time_s"] = None if max_time.strip().lower() in CLEAR else \
                parse_time(max_time)
        except ValueError as e:
            fail(str(e))
    if account is not None:
        fields["account"] = None if account.strip().lower() in CLEAR else account.strip()
    if reset and fields:
        fail("--reset clears everything: give it alone")
    if not reset and not fields:
        fail("nothing to set: give --weight, --max-in-use, --max-queued, --priority-limit, "
             "--max-time, --account or --reset")
    with client(url, token, state_dir, token_file=token_file) as c:
        if reset:
            cleared = call(c.clear_quota, owner)
            typer.echo(json.dumps(cleared, default=str) if json_out else
                       f"quota of {owner} cleared (defaults: weight 1, no limits)")
            return
        out = call(c.set_quota, owner, **fields)
    if json_out:
        typer.echo(json.dumps(out, default=str))
        return
    q = out.get("quota") or {}
    typer.echo("quota of {}: weight {}, max in use {}, max queued {}, priority limit {}".format(
        *_row({**q, "owner": owner})))
    line = _tenancy_line(out.get("tenancy") or {})
    if line:
        typer.echo(line, err=True)


@quota_app.command("account")
def set_account(
    name: Annotated[str, typer.Argument(help="The account (1-64 letters, digits, . _ -).")],
    weight: Annotated[str, typer.Option(
        "--weight", help="The account's fair-share weight (`none`: the default 1): accounts "
        "share the cluster by these weights, then their owners by theirs.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the API's answer (JSON).")]
    = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Set an account's fair-share weight (admin only); owners join it with `quota set
    USER --account NAME`."""
    _, w = _number(weight, "--weight", positive=True)
    with client(url, token, state_dir, token_file=token_file) as c:
        out = call(c.set_account_weight, name, w)
    typer.echo(json.dumps(out, default=str) if json_out else
               f"account {name}: weight {'-' if w is None else f'{w:g}'}")


@quota_app.command("show")
def show(
    owner: Annotated[str | None, typer.Argument(help="One user (default: every owner with a "
                                                "weight or quota).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    url: Url = None,
    token: Token = None,
    token_file: TokenFile = None,
    state_dir: StateDir = None,
) -> None:
    """Show owners' weights and quotas, and whether tenancy is on (admin only). Usage
    against entitlement is in `miso status`."""
    with client(url, token, state_dir, token_file=token_file) as c:
        out = {"quota": call(c.quota, owner)} if owner is not None else call(c.quotas)
    if json_out:
        typer.echo(json.dumps(out, indent=2))
        return
    rows = [out["quota"]] if owner is not None else out.get("quotas", [])
    t = Table(title="Quotas")
    for col in ("owner", "weight", "max in use (GPU-eq)", "max queued", "priority limit"):
        t.add_column(col)
    for q in rows:
        t.add_row(*(safe(x) for x in _row(q)))
    console.print(t)
    line = _tenancy_line(out.get("tenancy") or {})
    if line:
        console.print(safe(line))
