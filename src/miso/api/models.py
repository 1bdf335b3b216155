"""Request bodies of the HTTP API (pydantic): bounded sizes, checked names, no extra fields."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from miso.controller.quotas import MAX_IN_USE, MAX_QUEUED, MAX_WEIGHT, MIN_WEIGHT, check_priority
from miso.sched.tenancyconfig import parse_priority
from miso.timelimit import MAX_TIME_S

ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
JOB_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$"

Arg = Annotated[str, Field(max_length=8192)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitRequest(_Body):
    """``POST /api/v1/jobs``."""

    command: list[Arg] = Field(min_length=1, max_length=1024)
    name: str | None = Field(default=None, pattern=JOB_NAME)
    memory_gb: float | None = Field(default=None, gt=0, le=4096)
    #: host (CPU) memory the job may hold, GB (default: its node's; issue 26)
    host_memory_gb: float | None = Field(default=None, gt=0, le=65536, strict=True)
    workload: str | None = Field(default=None, max_length=128)
    env: dict[str, Annotated[str, Field(max_length=32768)]] = Field(default_factory=dict,
                                                                   max_length=512)
    cwd: str | None = Field(default=None, max_length=4096)
    #: Chosen by the client; a retried submission with the same id returns the same job.
    request_id: str | None = Field(default=None, min_length=8, max_length=128,
                                   pattern=r"^[A-Za-z0-9_.-]+$")

    #: ``high``, ``normal``, ``low`` or an integer (who may ask for more than ``normal``:
    #: admins, and users up to their ``priority_limit``).
    priority: int | Annotated[str, Field(max_length=16)] | None = None
    #: The most the job may run, in seconds (``miso submit --time``; Slurm's formats are
    #: parsed by the client): past it it is checkpointed and ended.
    time_limit_s: float | None = Field(default=None, gt=0, le=MAX_TIME_S)
    #: Whole GPUs the job runs on at once (a gang when > 1; at most the cluster's GPUs).
    num_gpus: int = Field(default=1, ge=1, le=65536)
    #: Nodes a gang is spread over, equal counts each (None: as few as fit).
    nodes: int | None = Field(default=None, ge=1, le=65536)
    #: The MIG profile the job runs on, only (``miso submit --profile 3g.20gb``).
    profile: str | None = Field(default=None, pattern=r"^[0-9]+g\.[0-9]+gb(\+[a-z]+)?$",
                                max_length=32)
    #: Jobs (ids or names) that must end before this one may start (``--after``).
    after: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list, max_length=64)

    @field_validator("priority")
    @classmethod
    def _priority(cls, v: int | str | None) -> int | None:
        return _priority_value(v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the command's first word is empty")
        if any("\x00" in a for a in v):
            raise ValueError("NUL byte in the command")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not re.match(ENV_KEY, k):
                raise ValueError(f"bad environment variable name {k!r}")
            if "\x00" in val:
                raise ValueError(f"NUL byte in the value of {k}")
        return v

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or "\x00" in v):
            raise ValueError("cwd must be an absolute path")
        return v


class UserRequest(_Body):
    """``POST /api/v1/users``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    admin: bool = False
    unix_user: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}$")


def _priority_value(v: int | str | None) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool):
        raise ValueError("expected high, normal, low or an integer")
    return check_priority(parse_priority(v))


class AccountRequest(_Body):
    """``PUT /api/v1/accounts/{name}``: the account's fair-share weight (null: the default)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    weight: float | None = Field(default=None, ge=MIN_WEIGHT, le=MAX_WEIGHT)


class QuotaRequest(_Body):
    """``PUT /api/v1/quotas/{name}``: the fields given are set (null clears one: the default,
    no limit); the others are kept."""

    #: numbers as JSON numbers only: ``"2"`` and ``true`` are refused (issue 26)
    model_config = ConfigDict(extra="forbid", strict=True)

    weight: float | None = Field(default=None, ge=MIN_WEIGHT, le=MAX_WEIGHT)
    max_in_use: float | None = Field(default=None, ge=0, le=MAX_IN_USE)
    max_queued: int | None = Field(default=None, ge=0, le=MAX_QUEUED)
    priority_limit: int | Annotated[str, Field(max_length=16)] | None = None
    #: The longest time limit the user's jobs may have, and their default (seconds).
    max_time_s: float | None = Field(default=None, gt=0, le=MAX_TIME_S)
    #: The account the user is in (fair share between accounts first; null: none).
    account: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

    @field_validator("priority_limit")
    @classmethod
    def _limit(cls, v: int | str | None) -> int | None:
        return _priority_value(v)

    @field_validator("weight", "max_in_use")
    @classmethod
    def _no_negative_zero(cls, v: float | None) -> float | None:
        if v is not None and math.copysign(1.0, v) < 0:
            raise ValueError("must not be negative (-0.0)")
        return v
