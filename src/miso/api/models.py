"""Request bodies of the HTTP API (pydantic): bounded sizes, checked names, no extra fields."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    workload: str | None = Field(default=None, max_length=128)
    env: dict[str, Annotated[str, Field(max_length=32768)]] = Field(default_factory=dict,
                                                                   max_length=512)
    cwd: str | None = Field(default=None, max_length=4096)
    #: Chosen by the client; a retried submission with the same id returns the same job.
    request_id: str | None = Field(default=None, min_length=8, max_length=128,
                                   pattern=r"^[A-Za-z0-9_.-]+$")

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
