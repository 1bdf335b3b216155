"""Live controller: durable job store, the shared scheduling core driving agents."""

from miso.controller.controller import (
    Controller,
    ControllerConfig,
    QuotaExceeded,
    SubmitConflict,
    SubmitError,
)
from miso.controller.store import JobRecord, JobStore, StoreError
from miso.nodeerrors import NodeUnavailable
from miso.transport.base import Transport

__all__ = [
    "Controller", "ControllerConfig", "JobRecord", "JobStore", "NodeUnavailable", "QuotaExceeded",
    "StoreError", "SubmitConflict", "SubmitError", "Transport",
]
