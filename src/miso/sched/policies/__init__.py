"""Built-in policies (importing this module registers them)."""

from miso.sched.policies.baselines import MpsOnly, NoPart, OptSta
from miso.sched.policies.miso import Miso, oracle
from miso.sched.policies.misoplus import MisoPlus

__all__ = ["Miso", "MisoPlus", "MpsOnly", "NoPart", "OptSta", "oracle"]
