"""The cluster view the web page draws (``GET /api/v1/cluster``), built from a ``status()``
snapshot, the observer's observed/predicted speeds and the recent decision records. Pure.

Shape: ``{"time", "policy", "gpus": [{"id", "node", "model", "units", "phase",
"pending_plan", "slices": [{"profile", "start", "size", "compute_slices", "memory_gib",
"job", "mps_share"}], "jobs"}], "jobs": [{"id", "name", "owner", "state", "gpu", "slice",
"progress", "iteration", "total", "rate", "speed": {"observed", "predicted", "profile"},
"restarts", "submitted_at", "wait_reason", "reason"}], "queue": [{"id", "name", "owner",
"waited_s", "reason"}], "decisions": [record + "text"]}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from miso.jobstatus import JobStatus
from miso.mig import gpu_model
from miso.observe.decisionwords import describe

#: What another user's job id reads as in a masked view.
OTHER = "other"
#: How a slice that another user's job runs on is labelled for a reader who may not see it.
OTHER_NAME = "another user's job"
#: Job states that occupy a slice (counted as running in the header).
_ON_GPU = {JobStatus.RUNNING, JobStatus.PROFILING, JobStatus.CHECKPOINTING}


def mentioned_jobs(obj: Mapping[str, Any]) -> list[str]:
    """Job ids a snapshot or a decision record mentions."""
    out: list[str] = []
    for j in obj.get("jobs") or []:
        out.append(str(j.get("id")) if isinstance(j, Mapping) else str(j))
    for g in obj.get("gpus") or []:
        out += [str(x) for x in g.get("jobs") or []]
    out += [str(x) for x in obj.get("queue") or []]
    out += [str(x) for x in obj.get("restarts") or []]
    for k in ("assignment", "current_assignment", "speeds", "std", "shares"):
        out += [str(x) for x in obj.get(k) or {}]
    if obj.get("job") is not None:
        out.append(str(obj["job"]))
    cause = obj.get("cause") or {}
    if cause.get("job") is not None:
        out.append(str(cause["job"]))
    out += [str(x) for x in cause.get("jobs") or []]
    out += [str(x) for x in obj.get("prior") or []]
    return out


#: The form of a job id (``j0001``; :mod:`miso.controller.store` hands them out).
_JOB_ID = re.compile(r"^j\d{4,}$")
_JOB_ID_IN_TEXT = re.compile(r"\bj\d{4,}\b")


def job_ids_in(obj: Any) -> set[str]:
    """Every job id anywhere in ``obj`` (as a value or a key, at any depth), whatever the
    field: what a masked view must hide is not limited to the fields :func:`mentioned_jobs`
    knows (e.g. a placement's ``resident`` jobs)."""
    out: set[str] = set()
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, Mapping):
            out |= {k for k in x if isinstance(k, str) and _JOB_ID.match(k)}
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
        elif isinstance(x, str) and _JOB_ID.match(x):
            out.add(x)
    return out


def is_other(job: Any) -> bool:
    """Whether ``job`` is a masked id (``"other"``, or ``"other 2"``... when one mapping held
    several hidden jobs)."""
    return isinstance(job, str) and (job == OTHER or job.startswith(OTHER + " "))


def mask(obj: Any, hidden: set[str]) -> Any:
    """``obj`` with every job id of ``hidden`` (as a value or a key) replaced by ``"other"``
    and the free-text fields of records that mention one dropped. Several hidden keys of one
    mapping stay distinct (``"other"``, ``"other 2"``, ...): an assignment keeps every busy
    slice busy."""
    if not hidden:
        return obj
    if isinstance(obj, Mapping):
        out = {}
        n_other = 0
        for k, v in obj.items():
            key = k
            if k in hidden:
                n_other += 1
                key = OTHER if n_other == 1 else f"{OTHER} {n_other}"
            out[key] = mask(v, hidden)
        for k in ("note", "origin", "command", "name", "reason"):
            if isinstance(out.get(k), str) and any(h in out[k] for h in hidden):
                out[k] = "(about another user's job)"
        return out
    if isinstance(obj, list):
        return [mask(x, hidden) for x in obj]
    if isinstance(obj, str):
        if obj in hidden:
            return OTHER
        # free text (a decision's "text"/"detail", a reason...) may name hidden jobs too
        return _JOB_ID_IN_TEXT.sub(lambda m: OTHER if m.group(0) in hidden else m.group(0),
                                   obj)
    return obj


def cluster_view(snap: Mapping[str, Any], *, speeds: Mapping[str, Mapping[str, Any]] | None = None,
                 decisions: Iterable[Mapping[str, Any]] = (),
                 visible: set[str] | None = None) -> dict[str, Any]:
    """The JSON view of one snapshot (see the module docstring). With ``visible`` (the job ids
    the reader may see) other jobs are shown as ``"other"``: slices and counts, no names."""
    speeds = speeds or {}
    counts = cluster_counts(snap)
    if visible is not None:
        snap = mask(snap, (set(mentioned_jobs(snap)) | job_ids_in(snap)) - visible)
        decisions = [mask(r, (set(ids) | job_ids_in(r)) - visible) for r in decisions
                     if (ids := mentioned_jobs(r)) and set(ids) & visible]
    now = float(snap.get("time") or 0.0)
    jobs = {str(j.get("id")): j for j in snap.get("jobs") or [] if j.get("id") != OTHER}
    gpus = [_gpu(g, jobs) for g in snap.get("gpus") or []]
    where = {j: g["id"] for g in snap.get("gpus") or [] for j in g.get("jobs") or []}
    phase = {g["id"]: g.get("phase") for g in snap.get("gpus") or []}
    queue = [str(q) for q in snap.get("queue") or []]
    qreason = queue_reasons(queue, jobs, snap.get("gpus") or [])
    out_jobs = []
    for jid, j in jobs.items():
        gpu = where.get(jid) or j.get("gpu")
        total = j.get("total")
        it = j.get("iteration")
        prog = (min(1.0, it / total) if isinstance(it, (int, float)) and total else None)
        state = str(j.get("state", ""))
        if state == JobStatus.FINISHED:
            prog = 1.0
        wait = None
        if state in (JobStatus.QUEUED, JobStatus.CHECKPOINTING):
            # the controller's own line on why it waits (status "why"), else ours
            wait = j.get("why") or qreason.get(jid) or _placed_reason(gpu, phase.get(gpu or ""))
        out_jobs.append({
            "id": jid, "name": j.get("name"),
            "owner": j.get("owner_name") or j.get("owner") or "",
            "state": state, "gpu": gpu, "slice": j.get("placement"),
            "progress": prog, "iteration": it, "total": total, "rate": j.get("rate"),
            "speed": dict(speeds.get(jid) or {}), "restarts": j.get("restarts", 0),
            "submitted_at": j.get("submitted_at"), "wait_reason": wait,
            "reason": j.get("reason") or "",
        })
    out_queue = []
    for q in queue:
        j = jobs.get(q, {})
        sub = j.get("submitted_at")
        out_queue.append({"id": q, "name": j.get("name"),
                          "owner": j.get("owner_name") or j.get("owner") or "",
                          "waited_s": round(now - float(sub), 1) if sub is not None else None,
                          "reason": j.get("why") or qreason.get(q, "")})
    if visible is not None:
        out_queue = [q for q in out_queue if q["id"] != OTHER]
    recs = [dict(r, text=describe(r)) for r in decisions]
    return {"time": now, "policy": snap.get("policy"), "gpus": gpus, "jobs": out_jobs,
            "queue": out_queue, "decisions": recs, "errors": list(snap.get("errors") or []),
            "counts": counts}


def cluster_counts(snap: Mapping[str, Any]) -> dict[str, int]:
    """The whole cluster's job counts (the page's header), whoever reads it: jobs on a GPU
    (running, profiling or checkpointing) and jobs queued."""
    on_gpu = {str(x) for g in snap.get("gpus") or [] for x in g.get("jobs") or []}
    on_gpu |= {str(j.get("id")) for j in snap.get("jobs") or []
               if str(j.get("state", "")) in _ON_GPU}
    return {"running": len(on_gpu), "queued": len(snap.get("queue") or [])}


def _gpu(g: Mapping[str, Any], jobs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    model_name = str(g.get("model", ""))
    try:
        model = gpu_model(model_name)
        units = model.units
    except KeyError:
        model, units = None, 0
    by_slice = {str(pl): j for j, pl in (g.get("assignment") or {}).items()}
    shares = dict(g.get("mps_shares") or {})
    # jobs sharing the full slice under MPS: MPS-only plans, or a profiling run of the mix
    mps_jobs = sorted(shares) if shares else (
        list(g.get("jobs") or []) if g.get("phase") == "profiling" else [])
    slices = []
    for s in g.get("layout") or []:
        prof, _, start = str(s).partition("@")
        size, cs, mem = 0, 0, 0.0
        if model is not None:
            try:
                p = model.profile(prof)
                size, cs, mem = p.size, p.compute_slices, p.memory_gib
            except KeyError:
                pass
        job = by_slice.get(str(s))
        if is_other(job):  # another user's job: busy, without its id or name
            slices.append({"profile": prof, "start": int(start or 0), "size": size,
                           "compute_slices": cs, "memory_gib": mem, "job": OTHER,
                           "job_state": None, "job_name": OTHER_NAME,
                           "mps_jobs": [OTHER if is_other(x) else x for x in mps_jobs]})
            continue
        slices.append({"profile": prof, "start": int(start or 0), "size": size,
                       "compute_slices": cs, "memory_gib": mem, "job": job,
                       "job_state": jobs.get(job, {}).get("state") if job else None,
                       "job_name": jobs.get(job, {}).get("name") if job else None,
                       "mps_jobs": [OTHER if is_other(x) else x for x in mps_jobs]})
    return {"id": g.get("id"), "node": g.get("node", ""), "model": model_name, "units": units,
            "phase": g.get("phase"), "pending_plan": g.get("pending_plan"),
            "slices": sorted(slices, key=lambda x: x["start"]),
            "jobs": [OTHER if is_other(x) else x for x in g.get("jobs") or []],
            "mps_shares": shares}


def queue_reasons(queue: list[str], jobs: Mapping[str, Mapping[str, Any]],
                  gpus: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Why each queued job waits (FIFO: the head waits for room, the others for the head)."""
    out: dict[str, str] = {}
    gpus = list(gpus)
    if not queue:
        return out
    head = queue[0]
    mem = jobs.get(head, {}).get("memory_gb")
    if not gpus:
        out[head] = "no GPU has joined the cluster yet"
    else:
        full = []
        for g in gpus:
            try:
                model = gpu_model(str(g.get("model")))
            except KeyError:
                continue
            if len(g.get("jobs") or []) >= model.max_instances:
                full.append(g.get("id"))
        if len(full) == len(gpus):
            out[head] = f"every GPU holds its maximum of jobs ({len(gpus)} GPUs)"
        else:
            need = f" ({mem:g} GB)" if isinstance(mem, (int, float)) else ""
            out[head] = (f"no GPU can fit it{need} next to its resident jobs, or a plan is "
                         f"being decided; it goes first when room frees up")
    for q in queue[1:]:
        out[q] = f"behind job {head} in the first-come-first-served queue"
    return out


def _placed_reason(gpu: str | None, phase: str | None) -> str | None:
    if not gpu:
        return None
    if phase == "profiling":
        return f"on {gpu}: its mix is being profiled under MPS"
    if phase == "reconfiguring":
        return f"on {gpu}: the GPU is being repartitioned for it"
    return f"on {gpu}: waiting for its slice"
