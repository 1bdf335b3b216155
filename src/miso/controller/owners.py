"""The per-owner view of a cluster with tenancy: usage against entitlement, quotas, queue and
GPU counts (``miso status``, the web page), and what a reader who is not an admin may see of
it. Pure.

Usage is GPU-equivalent-seconds decayed by the half-life (:mod:`miso.sched.tenancy`);
``usage_share`` is the owner's part of every owner's usage and ``share`` its entitlement (its
weight's part of the weights of the owners shown): an owner with ``usage_share`` above
``share`` has had more than its share lately and waits behind the others under fair share.

A reader who is not an admin sees its own row and one ``others`` row of sums and counts (how
many other owners, their jobs queued and on GPUs, the GPU-equivalents they hold): never other
owners' names or ids (issue 15's rule: other users' jobs as counts only). The same rule words
a job's fair-share wait (:func:`fair_wait_reason`): the owners ahead by name for an admin,
as counts for anyone else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from miso.controller.quotas import Quota
from miso.sched.policies.ordernote import counts

#: The row of every owner but the reader, for a reader who is not an admin.
OTHERS = "others"


def owner_table(report: Mapping[str, Mapping[str, Any]], quotas: Iterable[Quota],
                names: Mapping[str, str], default_weight: float = 1.0
                ) -> dict[str, dict[str, Any]]:
    """Owner id -> row: the loop's report (``usage_gpu_s``, ``in_use``, ``weight``,
    ``fair_share``, ``queued``, ``running``) with the owner's ``name``, its ``usage_share``
    and ``share``, and its quotas (None: none). Owners with a quota and no job yet are
    listed too."""
    qs = {q.owner: q for q in quotas}
    rows: dict[str, dict[str, Any]] = {}
    for o in sorted(set(report) | set(qs)):
        r = dict(report.get(o) or {})
        q = qs.get(o)
        weight = r.get("weight")
        if weight is None:
            weight = q.weight if q is not None and q.weight is not None else default_weight
        rows[o] = {
            "name": names.get(o) or (q.name if q is not None else "") or o or "(operator)",
            "usage_gpu_s": float(r.get("usage_gpu_s") or 0.0),
            "in_use": float(r.get("in_use") or 0.0),
            "weight": float(weight),
            "fair_share": float(r.get("fair_share", 1.0)),
            "queued": int(r.get("queued") or 0), "running": int(r.get("running") or 0),
            "held": float(r.get("held") or 0.0), "entitled": float(r.get("entitled") or 0.0),
            "account": r.get("account"),
            "max_in_use": q.max_in_use if q is not None else None,
            "max_queued": q.max_queued if q is not None else None,
            "priority_limit": q.priority_limit if q is not None else None,
        }
    tot_u = sum(r["usage_gpu_s"] for r in rows.values())
    tot_w = sum(r["weight"] for r in rows.values())
    for r in rows.values():
        r["usage_share"] = r["usage_gpu_s"] / tot_u if tot_u > 0 else 0.0
        r["share"] = r["weight"] / tot_w if tot_w > 0 else 0.0
    return rows


def owner_view(table: Mapping[str, Mapping[str, Any]], viewer: str | None,
               viewer_name: str = "") -> list[dict[str, Any]]:
    """The rows a reader sees, each with its ``owner`` (name): every row for an admin
    (``viewer`` None; with ``id``; by name), else the reader's own row (``viewer``: its user
    id, ``viewer_name`` its name; zeros when it has none) and one ``others`` row of sums."""
    if viewer is None:
        rows = [{"owner": r.get("name") or o, "id": o, **_fields(r)} for o, r in table.items()]
        return sorted(rows, key=lambda r: (str(r["owner"]), r["id"]))
    mine = table.get(viewer)
    rest = [r for o, r in table.items() if o != viewer]
    own = {"owner": (mine or {}).get("name") or viewer_name or "you", **_fields(mine or {})}
    others = {"owner": OTHERS, "owners": len(rest),
              "in_use": sum(float(r.get("in_use") or 0.0) for r in rest),
              "usage_share": sum(float(r.get("usage_share") or 0.0) for r in rest),
              "share": sum(float(r.get("share") or 0.0) for r in rest),
              "held": sum(float(r.get("held") or 0.0) for r in rest),
              "entitled": sum(float(r.get("entitled") or 0.0) for r in rest),
              "queued": sum(int(r.get("queued") or 0) for r in rest),
              "running": sum(int(r.get("running") or 0) for r in rest)}
    return [own, others] if rest else [own]


_KEYS = ("usage_gpu_s", "usage_share", "in_use", "weight", "share", "fair_share", "queued",
         "running", "held", "entitled", "account", "max_in_use", "max_queued",
         "priority_limit")


def _fields(r: Mapping[str, Any]) -> dict[str, Any]:
    defaults: dict[str, Any] = {"usage_gpu_s": 0.0, "usage_share": 0.0, "in_use": 0.0,
                                "weight": 1.0, "share": 0.0, "fair_share": 1.0, "queued": 0,
                                "running": 0, "held": 0.0, "entitled": 0.0}
    return {k: r.get(k, defaults.get(k)) for k in _KEYS}


def fair_wait_reason(fw: Mapping[str, Any], *, admin: bool) -> str:
    """One line on why a job waits under fair share, from its
    :class:`~miso.sched.fairwait.FairWait` as JSON (owners by name): its owner's GPUs
    against its entitlement, and how many jobs of owners who used less of their share go
    first; which owners, only for an ``admin`` (anyone else reads its own jobs' reasons, and
    sees other users' jobs as counts only)."""
    owner = str(fw.get("owner") or "(none)")
    parts = []
    ent = fw.get("entitlement")
    held = float(fw.get("held") or 0.0)
    if ent is not None and fw.get("over"):
        parts.append(f"owner {owner} holds {held:.1f} GPUs, more than its entitlement of "
                     f"{float(ent):.1f}: its jobs get only the room owners within theirs leave")
    elif ent is not None:
        parts.append(f"owner {owner} holds {held:.1f} GPUs of its {float(ent):.1f} "
                     f"entitlement")
    ahead = {str(o): int(n) for o, n in (fw.get("ahead") or {}).items()}
    n = sum(ahead.values())
    if n:
        k = len(ahead)
        text = (f"{n} job{'s' if n != 1 else ''} of {k} owner{'s' if k != 1 else ''} who "
                f"used less of their share lately go{'es' if n == 1 else ''} first")
        parts.append(f"{text} ({counts(ahead)})" if admin else text)
    return "waiting under fair share: " + "; ".join(parts)
