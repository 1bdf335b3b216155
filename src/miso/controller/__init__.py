"""Live controller: durable job store, the shared scheduling core driving agents."""

from miso.controller.controller import Controller, ControllerConfig, SubmitConflict, SubmitError
from miso.controller.store import JobRecord, JobStore, StoreError
from miso.transport.base import NodeUnavailable, Transport

__all__ = [
    "Controller", "ControllerConfig", "JobRecord", "JobStore", "NodeUnavailable", "StoreError",
    "SubmitConflict", "SubmitError", "Transport",
]
