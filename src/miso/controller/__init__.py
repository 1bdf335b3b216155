"""Live controller: durable job store, the shared scheduling core driving agents."""

from miso.controller.controller import (
    Controller,
    ControllerConfig,
    QuotaExceeded,
    SubmitConflict,
    SubmitError,
)
from miso.controller.store import JobRecord, JobStore, StoreError
from miso.transport.base import NodeUnavailable, Transport

__all__ = [
    "Controller", "ControllerConfig", "JobRecord", "JobStore", "NodeUnavailable", "QuotaExceeded",
    "StoreError", "SubmitConflict", "SubmitError", "Transport",
]
