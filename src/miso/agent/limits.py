"""A job's bounds on its node as its guard applies and measures them (issue 26, item 3).

``--max-procs N``: the job's processes at most (cgroup ``pids.max``; RLIMIT_NPROC of its
account, set before the drop); ``--max-memory BYTES``: its host memory (cgroup
``memory.max``; RLIMIT_DATA, set before the drop); ``--io-weight W`` (cgroup ``io.weight``);
``--disk-budget BYTES`` over ``--disk-dirs`` (a JSON list: its checkpoint dir, its own
files): measured every DISK_EVERY_S. A job at or past a bound is ended; its exit record
says ``limit`` (a distinct end state, "over_limit" in the store).

Stdlib only: the guard (:mod:`miso.agent.guard`) imports it in its isolated interpreter
(``python -I -S``), where miso cannot be imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

try:  # a module of miso
    from miso.agent.jobprocs import descendants
except ImportError:  # in the guard's isolated interpreter: its sibling, by path
    from jobprocs import descendants  # type: ignore[no-redef]

BOUNDS_EVERY_S = 0.5
DISK_EVERY_S = 2.0
#: Most entries a disk measurement visits (a job's tree of a million empty files is bounded
#: by this, not by its size).
DISK_MAX_ENTRIES = 200_000


def bounds_of(args: dict[str, str]) -> dict[str, int]:
    """The bounds among the guard's options (absent: no bound)."""
    out = {}
    for key in ("max-procs", "max-memory", "io-weight", "disk-budget"):
        v = args.get(f"--{key}", "")
        if v.isdigit() and int(v) > 0:
            out[key] = int(v)
    return out


def data_limit(max_memory: int) -> int:
    """RLIMIT_DATA for a memory bound: a margin above it, so that the guard's sampler (which
    ends the job at the bound, a clear reason) usually acts first; the kernel's refusal is
    the hard stop for an allocation faster than the sampler."""
    return max_memory + max(max_memory // 8, 64 << 20)


@contextlib.contextmanager
def job_rlimits(bounds: dict[str, int]) -> Iterator[None]:
    """RLIMIT_NPROC and RLIMIT_DATA (:func:`data_limit`) lowered on this (root) guard while it
    starts the job, so the job inherits them from before the drop to its account; the guard's
    own are restored
    after (root is not bound by NPROC; DATA applies to it only for that moment).
    RLIMIT_NPROC counts every process of the account (its other jobs too). RLIMIT_AS is not
    used: CUDA reserves far more address space than memory."""
    import resource  # noqa: PLC0415 - stdlib, only when bounded

    saved = []
    for key, res in (("max-procs", resource.RLIMIT_NPROC), ("max-memory", resource.RLIMIT_DATA)):
        if key in bounds:
            old = resource.getrlimit(res)
            want = bounds[key] if key == "max-procs" else data_limit(bounds[key])
            lim = want if old[1] == resource.RLIM_INFINITY else min(want, old[1])
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(res, (lim, lim))
                saved.append((res, old))
    try:
        yield
    finally:
        for res, old in saved:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(res, old)


def limit_cgroup(path: str | None, home: str | None, bounds: dict[str, int]) -> list[str]:
    """Write the bounds to the attempt's cgroup where its controllers are available (asked of
    ``home``'s subtree first); returns the files written."""
    if path is None:
        return []
    if home is not None:
        for ctl in ("pids", "memory", "io"):
            with contextlib.suppress(OSError), \
                    open(os.path.join(home, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{ctl}")
    done = []
    for key, name, value in (("max-procs", "pids.max", "{}"), ("max-memory", "memory.max", "{}"),
                             ("max-memory", "memory.swap.max", "0"),
                             ("io-weight", "io.weight", "default {}")):
        if key in bounds:
            try:
                with open(os.path.join(path, name), "w") as f:
                    f.write(value.format(bounds[key]))
                done.append(name)
            except OSError:
                pass
    return done


def _rss(pids: list[int]) -> int:
    size = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError), \
                open(f"/proc/{pid}/statm", "rb") as f:
            total += int(f.read(256).split()[1]) * size
    return total


def disk_used(dirs: list[str]) -> int:
    """Bytes allocated under ``dirs`` (the job's own: walked through directory fds, links
    never followed; at most DISK_MAX_ENTRIES entries)."""
    total, seen = 0, 0
    for d in dirs:
        with contextlib.suppress(OSError):
            for _top, dnames, fnames, dfd in os.fwalk(d, follow_symlinks=False):
                for name in (*dnames, *fnames):
                    seen += 1
                    with contextlib.suppress(OSError):
                        total += os.stat(name, dir_fd=dfd, follow_symlinks=False).st_blocks * 512
                if seen > DISK_MAX_ENTRIES:
                    return total
    return total


def over_bounds(bounds: dict[str, int], job_pid: int, cgroup: str | None) -> str:
    """Why the job is at or past its process or memory bound now, or ""."""
    if "max-procs" not in bounds and "max-memory" not in bounds:
        return ""
    pids = descendants(os.getpid())
    if "max-procs" in bounds and len(pids) >= bounds["max-procs"]:
        return f"processes: {len(pids)} reached its bound of {bounds['max-procs']}"
    if "max-memory" in bounds:
        used = _rss(pids)
        PEAK_RSS[0] = max(PEAK_RSS[0], used)
        if cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(cgroup, "memory.events")) as f:
                    ev = dict(line.split() for line in f if line.strip())
                if int(ev.get("oom_kill", "0")) > 0:
                    return f"host memory: killed by the kernel at {bounds['max-memory']} bytes"
        if used >= bounds["max-memory"]:
            return (f"host memory: {used / 2**30:.2f} GiB resident reached its bound of "
                    f"{bounds['max-memory'] / 2**30:.2f} GiB")
    return ""


#: The job's largest resident memory seen by :func:`over_bounds`.
PEAK_RSS = [0]


def limit_at_exit(bounds: dict[str, int], rc: int) -> str:
    """Why a job that failed by itself did so at its memory bound (its allocation refused by
    RLIMIT_DATA after the sampler saw it near the bound), or ""."""
    if rc == 0 or "max-memory" not in bounds:
        return ""
    import resource  # noqa: PLC0415 - stdlib, only when bounded

    # the kernel's peak of every reaped process of the job (the sampler may miss a fast one)
    peak = max(PEAK_RSS[0], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    if peak < 0.9 * bounds["max-memory"]:
        return ""
    return (f"host memory: failed at {peak / 2**30:.2f} GiB resident, at its bound of "
            f"{bounds['max-memory'] / 2**30:.2f} GiB")


def over_disk(bounds: dict[str, int], dirs: list[str]) -> str:
    """Why the job is past its disk budget now, or ""."""
    if "disk-budget" not in bounds or not dirs:
        return ""
    used = disk_used(dirs)
    if used > bounds["disk-budget"]:
        return (f"disk: {used / 2**20:.0f} MiB in its checkpoint dir and files, over its "
                f"budget of {bounds['disk-budget'] / 2**20:.0f} MiB")
    return ""


def write_limit_record(path: str | None, why: str, returncode: int | None = None) -> None:
    """The exit record of a job ended for a bound (``limit``: the reason)."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"returncode": returncode, "fenced": False, "why": why, "limit": why,
                       "time": time.time()}, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
