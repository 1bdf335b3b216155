"""Where a protected owner's jobs run, not how large their fair slices are (issue 31, the
saturated cell): a placement filter that keeps the other owners' jobs off the GPUs a
protected owner's jobs run on, and optionally packs the protected owner's jobs on few GPUs of
their own. Pure: no I/O. **An experiment, not shipped** (:func:`keep_apart_profile` builds a
profile with it): measured no better (benchmarks/history/2026-12-03-h13-sat.md).

**Why it was tried.** At 3.25x the cluster (two owners 80/20, 16 A100-40GB, fair share with
a stated price of 5 %) the light owner's average JCT is 1.56-1.72x its JCT alone on its
entitled 8 GPUs; alone, miso+ packs only its own jobs there. The hypothesis: keep the light
owner's jobs among themselves (as alone) and lend the rest of the cluster as today.

**What the light owner's extra JCT is** (seed 1, the note above): 91 % run time, 9 % waiting
for a first start; its jobs run on 2.1 compute slices on average (74 % of their run time on
the 2g fair slice the stated price buys, 10 % on 1g while it has more than 28 active jobs)
against 4.2 alone. A placement rule does not change a job's speed on a slice (MIG isolates),
so it can help only through the sizes the optimizer then gives: the rule below gave the
light owner no larger slices for the same price.

**The rule** (:class:`KeepApart`), with a stated price and entitlements: a job of an owner
that is not protected (above its entitlement) may not join a GPU holding a protected
owner's job (``block``); a protected owner's job may join a GPU holding none of its jobs
only while its jobs are on at most ``ceil(held x pack) + 1`` GPUs (``pack`` > 0; ``held``:
the GPUs it holds, tenancy's unit).

Measured (seed 1, `--fairness-price 0.05`, 3.25x; shipped miso+ +3.49 %, light 1.557):
``block`` only +3.54 %, 1.575; ``block`` and ``pack`` 1 +9.62 %, 1.677; ``pack`` 1 only
+7.91 %, 1.753. ``block`` on seeds 2 and 3: +8.70 %, 1.594 and +5.55 %, 1.647 (miso+ +6.88 %,
1.606 and +5.16 %, 1.721): the mean moves 0.03 of sharing incentive per point of price, less
than the fair slices' size does, and within the noise of a neutral change there (a salted
victim order moves one seed 3.8 points and 0.30).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from miso.sched.policies import PROFILES
from miso.sched.policies.framework import Cycle, Profile

#: The memo key of one cycle's facts (:meth:`KeepApart.facts`).
MEMO = "keep_apart"


@dataclass(frozen=True)
class KeepApart:
    """A filter plugin (:class:`~miso.sched.policies.framework.Filter`): the module's rule.
    ``block``: keep owners above their entitlement off a protected owner's GPUs; ``pack``:
    the protected owner's jobs on at most ``ceil(held x pack) + 1`` GPUs (0: anywhere)."""

    block: bool = True
    pack: float = 0.0
    name: ClassVar[str] = "keep_apart"

    def active(self, cy: Cycle) -> bool:
        ten = cy.state.tenancy
        return (cy.owner_bound and ten is not None and ten.config.fairness_price is not None
                and (self.block or self.pack > 0))

    def facts(self, cy: Cycle) -> tuple[frozenset[str], dict[str, set[str]], dict[str, float]]:
        """(the protected owners, each owner's GPUs holding its jobs, what each holds), once
        per cycle."""
        got = cy.memo.get(MEMO)
        if got is None:
            sc, st = cy.sc, cy.state
            ten = st.tenancy
            assert ten is not None
            ents = sc.entitlements()
            prot = frozenset(o for o in ents if ten.protected(o, ents))
            gpus_of: dict[str, set[str]] = {}
            for g in st.gpus:
                for j in sc.jobs_on(g):
                    gpus_of.setdefault(st.jobs[j].spec.owner, set()).add(g)
            got = cy.memo[MEMO] = (prot, gpus_of, dict(ten.held))
        return got

    def reject(self, cy: Cycle, job: str, gpu: str, residents: Sequence[str]) -> str | None:
        prot, gpus_of, held = self.facts(cy)
        jobs = cy.state.jobs
        owner = jobs[job].spec.owner
        if owner not in prot:
            if self.block and any(jobs[r].spec.owner in prot and jobs[r].spec.owner != owner
                                  for r in residents):
                return f"{gpu} runs a protected owner's jobs: kept apart"
            return None
        mine = gpus_of.get(owner, set())
        if (self.pack > 0 and gpu not in mine
                and len(mine) >= math.ceil(held.get(owner, 0.0) * self.pack) + 1):
            return f"owner {owner}'s jobs pack on the {len(mine)} GPUs they run on"
        return None


def keep_apart_profile(base: str = "miso+", block: bool = True, pack: float = 0.0
                       ) -> Profile:
    """``PROFILES[base]`` with the :class:`KeepApart` filter after its own (named
    ``<base>/keep-apart``): e.g. ``POLICIES[p.name] = p`` for ``run_policy``."""
    prof = PROFILES[base].plus(filters=(KeepApart(block, pack),))
    return replace(prof, name=f"{base}/keep-apart")
