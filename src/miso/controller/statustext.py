"""What ``miso status`` says about nodes and waiting jobs: a lost node's line, owner ids
turned into user names, and one line on why a job is where it is (its failure, why it waits,
whether it is profiled). Pure functions of the controller's snapshot: the controller and the
API's views call them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from miso.controller.owners import fair_wait_reason
from miso.controller.profile_run import NOT_PROFILED
from miso.jobstatus import TERMINAL, JobStatus

NO_NODES = ("no agent is up: queued jobs wait for a GPU node (start one, or check "
             "`miso cluster up`)")


#: How long ``status`` still shows a node that was lost and is back (seconds).
RECENT_LOSS_S = 600.0


def prune_losses(lost: dict[str, dict[str, Any]], now: float | None = None) -> None:
    """Forget the lost nodes back for :data:`RECENT_LOSS_S` or more: ``status`` shows every
    node still lost, and a restarted agent for a while after it joined again."""
    t = time.time() if now is None else now
    for n in [n for n, d in lost.items()
              if d.get("back") is not None and t - float(d["back"]) >= RECENT_LOSS_S]:
        del lost[n]


def lost_node(node: str, d: dict[str, Any], fencing: bool) -> dict[str, Any]:
    """A lost node as ``status`` shows it: since when (wall clock), why, and what happens to
    its jobs (``fencing``: they move once its lease has run out; else they have moved and the
    node waits for its agent to join again; ``back`` in ``d``: it has joined again)."""
    since = float(d.get("since") or 0.0)
    phase = "fencing" if fencing else "waiting for its agent"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    if d.get("back") is not None and not fencing:
        back = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(d["back"])))
        return {"node": node, "since": since, "why": str(d.get("why") or ""), "phase": "back",
                "back": float(d["back"]),
                "text": f"node {node} was lost at {stamp} ({d.get('why')}); back since "
                        f"{back}: its jobs were requeued and resume from their checkpoints"}
    then = ("its jobs move once its lease has run out" if fencing else
            "its jobs were requeued; it joins again when its agent is back")
    return {"node": node, "since": since, "why": str(d.get("why") or ""), "phase": phase,
            "text": f"node {node} lost since {stamp} ({time.time() - since:.0f}s): "
                    f"{d.get('why')}; {then}"}


def owner_named(text: str, names: dict[str, str]) -> str:
    """``text`` with the owner id after ``owner `` replaced by the user's name."""
    head, sep, rest = text.partition("owner ")
    if not sep:
        return text
    oid, space, tail = rest.partition(" ")
    return f"{head}owner {names.get(oid, oid)}{space}{tail}"


def fair_named(waits: dict[str, dict[str, Any]], names: dict[str, str]
                ) -> dict[str, dict[str, Any]]:
    """The loop's fair-share waits with owners by user name, not id (one copy per shared
    entry)."""
    done: dict[int, dict[str, Any]] = {}
    out = {}
    for j, fw in waits.items():
        d = done.get(id(fw))
        if d is None:
            d = done[id(fw)] = {**fw, "owner": names.get(fw["owner"], fw["owner"]),
                                "ahead": {names.get(o, o): n for o, n in fw["ahead"].items()}}
        out[j] = d
    return out



#: Up to this many GPUs, a waiting job's line lists each GPU; beyond, their phases counted.
BUSY_LISTED = 16


class SnapIndex:
    """What each queued job's line reads from one snapshot, built once and shared by a page
    of lines (a scan of every GPU per line cost seconds for 1,000 lines at 1,024 GPUs): the
    GPU each placed job is on, and the placed jobs that cannot checkpoint."""

    def __init__(self, snap: dict[str, Any],
                 cannot_checkpoint: Callable[[str], bool] | None = None) -> None:
        self.snap = snap
        self.cannot_checkpoint = cannot_checkpoint
        self._on: dict[str, dict[str, Any]] | None = None
        self._pinned: list[str] | None = None
        self._phases: str | None = None

    def gpu_of(self, job: str) -> dict[str, Any] | None:
        """The (first) GPU of the snapshot that lists ``job``, else None."""
        if self._on is None:
            self._on = {}
            for g in self.snap["gpus"]:
                for x in g["jobs"]:
                    self._on.setdefault(x, g)
        return self._on.get(job)

    def phases(self) -> str:
        """The GPUs counted by phase and the jobs placed, in one line (a big cluster)."""
        if self._phases is None:
            gpus = self.snap["gpus"]
            phases: dict[str, int] = {}
            for g in gpus:
                phases[g["phase"]] = phases.get(g["phase"], 0) + 1
            self._phases = f"{len(gpus)} GPUs: " + ", ".join(f"{n} {ph}" for ph, n in sorted(
                phases.items())) + f", {sum(len(g['jobs']) for g in gpus)} jobs placed"
        return self._phases

    def pinned(self) -> list[str]:
        """Every placed job (GPU by GPU) that ``cannot_checkpoint`` says cannot checkpoint."""
        if self._pinned is None:
            cc = self.cannot_checkpoint
            self._pinned = [] if cc is None else [
                x for g in self.snap["gpus"] for x in g["jobs"] if cc(x)]
        return self._pinned


def why(j: dict[str, Any], snap: dict[str, Any],
        cannot_checkpoint: Callable[[str], bool] | None = None, *, admin: bool = False,
        owner_of: Callable[[str], str | None] | None = None,
        job_name: Callable[[str], str] | None = None, index: SnapIndex | None = None) -> str:
    """One line on why job ``j`` (a record as JSON) is where it is: its full failure reason
    when it ended, why it waits when queued (``snap`` is :meth:`Controller.cluster`), and for a
    job that sends no progress reports that it is not profiled. ``cannot_checkpoint(job id)``
    tells whether a resident of a GPU is pinned; ``job_name(job id)`` names it as the reader
    may see it ("job j0003 (train)", or "another user's job"); without it it is not named.
    A fair-share wait names the other owners ahead only for an ``admin`` reader. ``index``:
    a :class:`SnapIndex` of ``snap`` and ``cannot_checkpoint`` shared by a page of lines."""
    state = j["state"]
    if state in TERMINAL:
        return str(j.get("reason") or "")
    note = str(j.get("note") or "")
    silent = j.get("checkpointable") is False and j.get("iteration") is None
    if note == NOT_PROFILED and not silent:
        note = ""  # it was slow to start, then reported progress: the note is stale
    if state == JobStatus.PROFILING and silent:
        return "runs under MPS while its GPU's other jobs are measured; not measured itself " \
            "(no progress reports)"
    if state != JobStatus.QUEUED:
        return NOT_PROFILED if silent else note
    if not snap["gpus"]:
        fencing = snap.get("unreachable") or []
        return "waiting: no GPU node is up" + (f" ({', '.join(fencing)} unreachable)"
                                               if fencing else "")
    held = (snap.get("held") or {}).get(j["id"])
    if held:
        return f"waiting: {held}"
    after = (snap.get("after") or {}).get(j["id"])
    if after:
        return (f"waiting for job{'s' if len(after) != 1 else ''} {', '.join(after)} to end "
                "(--after)")
    fair = (snap.get("fair_wait") or {}).get(j["id"])
    if fair:
        return fair_wait_reason(fair, admin=admin)
    ix = index if index is not None else SnapIndex(snap, cannot_checkpoint)
    gpu = ix.gpu_of(j["id"])
    if gpu is not None:
        where = f"waiting on {gpu['id']}"
        if gpu["phase"] == "reconfiguring":
            return f"{where}: its MIG layout is being changed"
        if gpu["phase"] == "profiling":
            return f"{where}: its jobs are being profiled under MPS"
        others = [x for x in gpu["jobs"] if x != j["id"]]
        pinned = [x for x in others if cannot_checkpoint is not None and cannot_checkpoint(x)]
        if pinned:
            who = ", ".join(job_name(x) if job_name is not None else "a job there"
                            for x in pinned[:3])
            return (f"{where}: {who} cannot checkpoint and keeps its slice until it "
                    "ends; no layout adds this job beside it")
        return f"{where}: placed there, its new layout is not applied yet"
    declined = (snap.get("declined") or {}).get(j["id"])
    if declined:
        return declined_wait(declined)
    gpus = snap["gpus"]
    if len(gpus) <= BUSY_LISTED:
        busy = ", ".join(f"{g['id']} {g['phase']} {len(g['jobs'])} job"
                         f"{'' if len(g['jobs']) == 1 else 's'}" for g in gpus)
    else:  # a big cluster: GPUs by phase (one line, not one entry per GPU)
        busy = ix.phases()
    pinned = pinned_holders(j, snap, cannot_checkpoint, owner_of, admin=admin,
                            pinned=ix.pinned())
    return (f"waiting for a slice with {j.get('memory_gib') or 0:.1f} GiB; the policy has not "
            f"placed it ({busy})" + (f": {pinned}" if pinned else ""))


def declined_wait(d: dict[str, Any]) -> str:
    """Why a queued job waits for a whole GPU rather than share one (the policy's
    :class:`~miso.sched.decisions.RepartitionDeclined` for it, as the loop keeps it)."""
    n = int(d.get("restarts") or 0)
    gain, price = float(d.get("gain_s") or 0.0), float(d.get("price_s") or 0.0)
    if gain > 0 and n:
        because = (f"sharing it would end the jobs {gain:.0f} s sooner in total, but "
                   f"restarting its {n} running job{'s' if n != 1 else ''} costs "
                   f"{price:.0f} s")
    else:
        because = "sharing it would not end the jobs sooner, even without restarts"
    return f"waiting for a whole GPU rather than share {d.get('gpu')}: {because}"


def pinned_holders(j: dict[str, Any], snap: dict[str, Any],
                   cannot_checkpoint: Callable[[str], bool] | None,
                   owner_of: Callable[[str], str | None] | None, *, admin: bool,
                   pinned: list[str] | None = None) -> str:
    """Who else holds GPUs with jobs that cannot be moved (they do not checkpoint): for an
    ``admin``, ``bob's 2 jobs cannot be moved``; for anyone else ``another user's jobs cannot
    be moved`` (never a name); empty when no other owner's job is pinned. ``owner_of``: job ->
    owner name. ``pinned``: the placed jobs that cannot checkpoint (:meth:`SnapIndex.pinned`),
    when the caller has them."""
    if cannot_checkpoint is None or owner_of is None:
        return ""
    if pinned is None:
        pinned = SnapIndex(snap, cannot_checkpoint).pinned()
    mine = j.get("owner_name")
    counts: dict[str, int] = {}
    for x in pinned:
        if x == j["id"]:
            continue
        who = owner_of(x)
        if who != mine:
            counts[who or ""] = counts.get(who or "", 0) + 1
    if not counts:
        return ""
    if not admin:
        return "another user's jobs cannot be moved (they do not checkpoint)"
    return "; ".join(f"{o or 'the operator'}'s {n} job{'s' if n > 1 else ''} cannot be moved"
                     for o, n in sorted(counts.items())) + " (they do not checkpoint)"
