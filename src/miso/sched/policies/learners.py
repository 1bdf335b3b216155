"""miso+'s learners: what the events so far teach about jobs' work and restarts' cost,
read by every stage that prices time (the restart economy, admission, rebalancing, the burst
test). Each learner is fed at the top of a decision and by the policy's event hooks; none
reads the policy.

* :class:`WorkLearner`: a job's remaining work from its progress reports, and the typical
  work of a job that reported none.
* :class:`RestartCosts`: each job's measured restart cost (from the plan that restarts it to
  its first progress report after the relaunch) and the one restart price every stage uses
  (:meth:`RestartCosts.cost`).
"""

from __future__ import annotations

from miso.sched.decisions import ApplyLayout, Decision
from miso.sched.state import ClusterState


class WorkLearner:
    """Jobs' work (seconds alone on a full GPU): ``seen`` (job -> its work when first seen
    reporting) and ``stats`` ([sum, count] of those); ``default_s`` (3,000 s) before any
    job reported."""

    def __init__(self, default_s: float = 3000.0) -> None:
        self.default_s = default_s
        self.seen: dict[str, float] = {}
        self.stats = [0.0, 0.0]

    def remaining(self, st: ClusterState, job: str) -> float:
        """Work the job has left from its progress reports, folded into its state by the
        driver (:meth:`JobState.remaining_work`); :meth:`typical` when it reports none."""
        js = st.jobs.get(job)
        r = js.remaining_work(st.now) if js is not None else None
        if r is None:
            return self.typical()
        if job not in self.seen and js.progress is not None:  # type: ignore[union-attr]
            self.note(job, js.progress[1])  # type: ignore[union-attr]
        return max(1.0, r)

    def note(self, job: str, work: float) -> None:
        """``job`` first seen reporting ``work`` left."""
        self.seen[job] = work
        self.stats[0] += work
        self.stats[1] += 1

    def typical(self) -> float:
        """Work of a job that reported none yet (live, a newcomer declares no work): the mean
        work the other jobs had when first seen reporting, else ``default_s``. In the
        simulator every checkpointable job declares its work at submission, so this prices
        only jobs that never report; live, without it every newcomer looked like
        ``default_s`` (3,000 s) of work and the demo's 12 s jobs waited for whole GPUs where
        the simulator shared them."""
        total, n = self.stats
        return total / n if n >= 1 else self.default_s

    def forget(self, job: str) -> None:
        self.seen.pop(job, None)


#: A restart not seen to end within this many ``restart_s`` (1 min at least) is not measured.
STALE = 20.0


class RestartCosts:
    """The restart price: each job's measured cost (decision to its first progress report
    after the relaunch: checkpoint, reconfiguration, start, warm-up, restore), else the mean
    of the costs measured so far (three at least), else the configured ``prior_s`` (the
    price told and never learned is an experiment outside the product:
    :class:`miso.sched.experiments.ToldRestartPrice`). ``restarting``: gpu -> job -> when a
    plan restarted it; ``relaunching``: relaunched jobs not seen resuming; ``seen``: job ->
    its measured cost; ``stats``: [sum, count] of every cost measured."""

    def __init__(self, prior_s: float) -> None:
        self.prior_s = prior_s
        self.limit = STALE * max(prior_s, 60.0)  # a relaunch older than this is not measured
        self.restarting: dict[str, dict[str, float]] = {}
        self.relaunching: dict[str, tuple[float, float]] = {}  # job -> (plan, its ack)
        self.reported: set[str] = set()   # relaunched jobs that reported since the last call
        self._state: ClusterState | None = None
        self.seen: dict[str, float] = {}
        self.stats = [0.0, 0.0]

    def cost(self, job: str) -> float:
        """What restarting ``job`` costs (s); ``""``: a job not measured (the mean)."""
        got = self.seen.get(job)
        if got is not None:
            return got
        total, n = self.stats
        return total / n if n >= 3 else self.prior_s

    def note_plans(self, st: ClusterState, ran: set[str], now: float,
                   out: list[Decision]) -> None:
        """Remember when this call's plans restart a running job (before the state applies
        them), per GPU, to measure how long the job takes to report progress again."""
        for d in out:
            if isinstance(d, ApplyLayout):
                cur = st.gpus[d.gpu].assignment if d.gpu in st.gpus else {}
                for j, pl in d.assignment.items():
                    if j in ran and cur.get(j) != pl:
                        self.restarting.setdefault(d.gpu, {})[j] = now

    def note_applied(self, st: ClusterState, now: float, gpu: str) -> None:
        """A plan of ``gpu`` is carried out: its restarted jobs' old runs are stopped (live,
        the executor acknowledges after stopping and relaunching), so a progress report
        from now on is the new run's."""
        for j, t0 in self.restarting.pop(gpu, {}).items():
            js = st.jobs.get(j)
            if js is not None and js.gpu == gpu and js.finished_at is None:
                if now - self.relaunching.get(j, (now, now))[0] > self.limit:
                    del self.relaunching[j]  # gone stale: relaunched anew (last in order)
                self.relaunching[j] = (t0, now)

    def learn(self, st: ClusterState) -> list[str]:
        """Read each relaunched job's first progress report after the plan's
        acknowledgement (folded into its state by the driver, live or simulated; not a last
        report of the old run) as its restart cost: from the plan to that report. Only the
        relaunched jobs that reported since the last call are looked at (:meth:`reported_jobs`);
        one that ended or went stale (no relaunch seen within ``STALE`` prices) is dropped
        unmeasured when it next reports, or when it ends (:meth:`forget`). Returns the jobs
        whose cost was measured now (their price changed)."""
        measured: list[str] = []
        for j in self.reported_jobs(st):
            js, (t0, acked) = st.jobs.get(j), self.relaunching[j]
            if js is None or js.finished_at is not None or st.now - t0 > self.limit:
                del self.relaunching[j]  # ended, or no relaunch seen: nothing to learn
            elif (p := js.progress) is not None and p[0] > acked and p[2] > 0:
                self.seen[j] = p[0] - t0
                self.stats[0] += p[0] - t0
                self.stats[1] += 1
                del self.relaunching[j]
                measured.append(j)
        return measured

    def reported_jobs(self, st: ClusterState) -> list[str]:
        """The relaunched jobs that reported progress since the last call (the state tells
        of each report, :meth:`ClusterState.watch_progress`), in the order they were
        relaunched (so the costs are summed in that order); most calls, none."""
        if st is not self._state:
            self._state = st
            st.watch_progress(self._note)
            self.reported.update(self.relaunching)
        rep, self.reported = self.reported, set()
        if len(rep) > 1:
            return [j for j in self.relaunching if j in rep]
        return [j for j in rep if j in self.relaunching]

    def _note(self, job: str) -> None:
        if job in self.relaunching:
            self.reported.add(job)

    def forget(self, job: str) -> None:
        self.seen.pop(job, None)
        self.relaunching.pop(job, None)
