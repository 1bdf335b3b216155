"""A checkpoint request (SIGUSR1) at any moment of a helper-using job's life never kills it,
and SIGTERM during shutdown after a save keeps exit code 75 (issue 33 item 5). The job runs
under the real guard (as the agent starts it), signalled through the guard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from miso.agent import guard

SCRIPT = r'''
import atexit, os, sys, time
print("importing", flush=True)
time.sleep(float(os.environ["SLOW_IMPORT_S"]))        # a slow `import torch`
from miso import job
ctx = job.context()
if os.environ.get("SLOW_EXIT_S"):                     # slow interpreter shutdown
    atexit.register(lambda: (print("exiting", flush=True),
                             time.sleep(float(os.environ["SLOW_EXIT_S"]))))
print("training", flush=True)
total = int(os.environ["STEPS"])
for i in range(total):
    time.sleep(0.02)
    ctx.report(i + 1, total)
    if ctx.checkpoint_requested():
        ctx.save_json({"iteration": i + 1}, iteration=i + 1)
        print("saved", i + 1, flush=True)
        ctx.exit_checkpointed()
ctx.finish()
print("finished", flush=True)
'''


def _start(tmp: Path, **env: str) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp / "job.py").write_text(SCRIPT)
    ck = tmp / "ck"
    ck.mkdir()
    job_env = {"PATH": os.environ.get("PATH", ""), "MISO_JOB_ID": "j0001",
               "MISO_PROGRESS_FILE": str(tmp / "progress.json"),
               "MISO_CHECKPOINT_DIR": str(ck), "MISO_CHECKPOINT_FLAG": str(tmp / "flag"),
               "SLOW_IMPORT_S": "0", "STEPS": "20", **env}
    (tmp / "env.json").write_text(json.dumps(job_env))
    log = tmp / "job.log"
    proc = subprocess.Popen([sys.executable, "-I", "-S", guard.__file__,
                             "--env-file", str(tmp / "env.json"), "--log", str(log),
                             "--", sys.executable, str(tmp / "job.py")],
                            start_new_session=True)
    return proc, log


def _wait_for(log: Path, word: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.time() + 20
    while time.time() < deadline:
        if log.exists() and word in log.read_text():
            return
        assert proc.poll() is None, log.read_text() if log.exists() else "no output"
        time.sleep(0.02)
    raise AssertionError(f"{word!r} never appeared")


def _end(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigusr1_during_a_slow_import_is_a_request_not_a_death(tmp_path: Path) -> None:
    proc, log = _start(tmp_path, SLOW_IMPORT_S="1.0")
    _wait_for(log, "importing", proc)
    time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)            # the guard forwards it to the job
    assert _end(proc) == 75, log.read_text()
    assert "saved 1" in log.read_text()         # the request was kept for the helper


def test_sigusr1_during_training_saves_and_exits_75(tmp_path: Path) -> None:
    proc, log = _start(tmp_path, STEPS="500")
    _wait_for(log, "training", proc)
    time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    assert _end(proc) == 75, log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_during_shutdown_after_a_save_keeps_75(tmp_path: Path,
                                                        sig: signal.Signals) -> None:
    proc, log = _start(tmp_path, STEPS="500", SLOW_EXIT_S="1.0")
    _wait_for(log, "training", proc)
    proc.send_signal(signal.SIGUSR1)
    _wait_for(log, "exiting", proc)
    time.sleep(0.2)
    proc.send_signal(sig)
    assert _end(proc) == 75, log.read_text()


def test_sigusr1_during_shutdown_of_a_finished_job_keeps_0(tmp_path: Path) -> None:
    proc, log = _start(tmp_path, STEPS="3", SLOW_EXIT_S="1.0")
    _wait_for(log, "exiting", proc)
    time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    assert _end(proc) == 0, log.read_text()


def test_the_orderly_stop_counts_a_job_that_saved_and_is_still_exiting_as_saved() -> None:
    from miso.cluster.raystart import unsaved

    asked = {("j0001", 1): 5000, ("j0002", 1): None, ("j0003", 1): 10}
    still = [{"job": "j0001", "attempt": 1, "checkpoint_iteration": 5506},  # saved, exiting
             {"job": "j0002", "attempt": 1, "checkpoint_iteration": None},  # never saved
             {"job": "j0003", "attempt": 1, "checkpoint_iteration": 10}]    # not since asked
    assert unsaved(asked, still) == 2
    assert unsaved(asked, still[:1]) == 0


def test_the_store_follows_a_checkpoint_saved_again_at_the_same_path(tmp_path: Path) -> None:
    """checkpoint_iteration in status is fresh after a resume: the helper saved the same file
    at a later iteration than the store knew (e.g. during an orderly stop)."""
    from miso.controller.launcher import resume_point, stale_checkpoint
    from miso.job import JobContext

    ck = tmp_path / "ck"
    ctx = JobContext(env={"MISO_CHECKPOINT_DIR": str(ck)}, install_signal=False)
    path = ctx.save_json({"iteration": 5506}, iteration=5506)
    resume, found = resume_point(5000, path, ck)
    assert (resume, found) == (5506, path)
    assert stale_checkpoint(5000, path, resume, found)
    assert not stale_checkpoint(5506, path, 5506, path)


def test_a_program_another_account_cannot_reach_is_refused_at_submit(tmp_path: Path) -> None:
    """A venv's python is a world-readable symlink to a base interpreter in a private
    directory: refused at submit for a job run as another account, with the reason."""
    import pwd

    from miso.controller.reachable import unreachable

    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no account nobody")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    base = private / "python3"
    base.write_text("#!/bin/sh\n")
    base.chmod(0o755)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    tmp_path.chmod(0o755)
    (tmp_path / "venv").chmod(0o755)
    venv.chmod(0o755)
    (venv / "python").symlink_to(base)
    why = unreachable(str(venv / "python"), "nobody")
    assert why is not None and str(private) in why and "not searchable" in why
    assert unreachable("/bin/sh", "nobody") is None
    if os.geteuid() == 0:  # the controller refuses it at submit (it runs jobs as nobody)
        from miso.controller import Controller, ControllerConfig, SubmitError
        from miso.controller.store import JobStore
        from miso.sched import make_policy
        from miso.sched.clock import VirtualClock

        con = Controller(JobStore(":memory:"), None,  # type: ignore[arg-type]
                         ControllerConfig(policy="nopart"), checkpoint_root="/nonexistent",
                         clock=VirtualClock(), policy=make_policy("nopart"))
        with pytest.raises(SubmitError, match="not reachable by nobody"):
            con.submit([str(venv / "python"), "train.py"], unix_user="nobody")


NESTED = r'''
import os, signal, sys
from miso import job
ctx = job.context()
def handler_depth(frame):
    n = 0
    while frame is not None:
        n += frame.f_code.co_name == "_on_request"
        frame = frame.f_back
    return n
def line(frame, event, arg):
    # a second SIGTERM at every line the first request's handler runs below it: Python runs
    # its handler there, inside the first one (as when the node and the guard both send it)
    if event == "line" and handler_depth(frame) == 1 and frame.f_code.co_name != "_on_request":
        os.kill(os.getpid(), signal.SIGTERM)
    return line
sys.settrace(lambda frame, event, arg: line)
os.kill(os.getpid(), signal.SIGTERM)
sys.settrace(None)
print("requested" if ctx.checkpoint_requested() else "missed", flush=True)
'''


def test_a_second_sigterm_while_the_first_is_recorded_is_recorded_too(tmp_path: Path) -> None:
    """Python runs a signal handler inside another when a second signal comes meanwhile (the
    node's SIGTERM to every process and the guard's forwarded one, at once). Recording the
    request must not wait on itself: the job once hung there until its lease ran out."""
    env = {**os.environ, "MISO_PROGRESS_FILE": str(tmp_path / "progress.json"),
           "MISO_CHECKPOINT_DIR": str(tmp_path)}
    try:
        p = subprocess.run([sys.executable, "-c", NESTED], env=env, capture_output=True,
                           text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the job hung recording a checkpoint request")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "requested"
