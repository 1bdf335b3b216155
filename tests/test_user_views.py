"""What a user and an operator read (issue 33): names, not ids; explanations that agree with
the plan; every client command in one style. Fast tests over pure views and fakes."""

from __future__ import annotations

from rich.console import Console

from miso.cli.client import render_status
from miso.observe.decisions import name_owners
from miso.observe.observer import Observer, attach

UID = "u:bcdc0357106ff357"


def _text(tables: list) -> str:
    con = Console(width=200, record=True)
    for t in tables:
        con.print(t)
    return con.export_text()


def test_the_admins_status_owner_column_says_names_not_ids() -> None:
    st = {"user": "root", "admin": True, "policy": "miso", "gpus": [],
          "jobs": [{"id": "j0001", "name": "a", "state": "queued", "owner": UID,
                    "owner_name": "alice", "restarts": 0}]}
    out = _text(render_status(st))
    assert "alice" in out and UID not in out


def test_fair_share_lines_of_the_decision_log_name_owners() -> None:
    rec = {"kind": "PlaceJob", "note": f"job j0002 goes to g; fair share: starts {UID}'s job "
           f"before 3 jobs of u:0000000000000001 queued earlier",
           "order": f"fair share: starts {UID}'s job"}
    out = name_owners(rec, {UID: "alice"})
    assert "alice's job" in out["note"] and "alice's job" in out["order"]
    assert UID not in out["note"] and "u:0000000000000001" in out["note"]  # unknown: kept


def test_attach_gives_the_observer_the_controllers_owner_names() -> None:
    class Ctl:
        policy = None
        owner_names = {UID: "alice"}
        observer: Observer | None = None

        def status(self) -> dict:
            return {}

    ctl = Ctl()
    obs = attach(ctl, None, metrics=False)
    assert obs.owner_names is ctl.owner_names
