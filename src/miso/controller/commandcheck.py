"""Whether a submitted command's program exists on this host, answered from memory for a few
seconds after it was last found.

``shutil.which`` is two or three system calls for an absolute path (a walk of ``PATH`` for a
bare name); in the controller's process, busy with pollers, GPU workers and the decision loop,
each call hands back the interpreter lock and waits to get it again, which was milliseconds
per submission when thousands arrive with the same interpreter. A program found stays found
for :data:`FOUND_TTL_S`; one not found is looked up again every time (a program installed a
moment ago is found at once). The check is advisory: a program removed within the window
fails at launch, as one removed after a submission always did.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

#: Seconds a program found stays found without another lookup.
FOUND_TTL_S = 10.0
_MAX = 1024

_found: dict[str, float] = {}
_lock = threading.Lock()


def command_exists(program: str) -> bool:
    """True when ``program`` is on this process's ``PATH`` or is an existing path."""
    now = time.monotonic()
    at = _found.get(program)
    if at is not None and now - at < FOUND_TTL_S:
        return True
    ok = shutil.which(program) is not None or Path(program).exists()
    if ok:
        with _lock:
            if len(_found) >= _MAX:
                _found.clear()
            _found[program] = now
    return ok
