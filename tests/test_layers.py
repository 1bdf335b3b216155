"""Layers you can test (issue 27): a walk of every import in ``src/miso`` (module level,
inside functions and under ``TYPE_CHECKING`` alike) fails on one from a lower layer into a
higher one (docs/architecture.md, "Layers"), and the policy wing keeps its shape: no class
in ``sched/policies`` with more than two bases."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "miso"

#: Each top-level module or package of ``miso`` -> its layer (higher imports lower only).
LAYERS: dict[str, int] = {
    # stdlib-only leaves any layer may use
    "jobstatus": 0, "attemptstatus": 0, "sqlitebackup": 0, "raytoken": 0, "data": 0,
    "jobpaths": 0, "runtimedir": 0, "timelimit": 0, "nodeerrors": 0,
    "mig": 1,                      # hardware data
    "nodewire": 2,                 # the node protocol's wire forms (layout, exit record)
    "workloads": 2,                # the workload speed table
    "mps_speed": 2,                # the one MPS speed model (reads the workload table)
    "optimize": 3,                 # the layout optimizer
    "replicasolve": 3,             # the optimizer beside pinned service replicas
    "optimtables": 3,              # its per-geometry tables
    "optimfeasible": 3,            # its feasibility answers, remembered by structure
    "optimpairs": 3,               # its last step: the layout that keeps most jobs, restarts priced
    "bruteforce": 3,               # its naive reference solver
    "predict": 4,                  # the MPS -> MIG predictor
    "serving": 4,                  # inference: catalogue, replica queue, traces, the router
    "sched": 5,                    # the scheduling core (no I/O)
    "sim": 6,                      # the simulator (a driver without processes)
    "backend": 6, "job": 6, "emuworkload": 6,   # the GPU and the job side of a node
    "emuserve": 6, "loadgen": 6,   # the emulated inference server; the load generator
    "agent": 7,                    # the node agent
    "transport": 8,                # controller <-> agent calls
    "controller": 9,               # the live driver
    "observe": 10, "api": 10,      # service: metrics, decision log, web page; HTTP API
    "cluster": 11,                 # composition roots: LocalCluster, the Ray actors
    "raycluster": 12, "deploy": 12,  # starting clusters
    "cli": 13,                     # the command line
}

#: Upward imports that exist today and have an issue to remove them. The test fails on any
#: other, and on an entry here that is gone (so the list only shrinks). Empty since the
#: composition roots moved from ``transport/`` to ``cluster/`` (issue 27).
KNOWN: set[tuple[str, str]] = set()


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "miso" and len(parts) > 1 else None


def _module_of(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def imports() -> list[tuple[str, str]]:
    """(importing module, imported miso module) of every import statement under src/miso."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        mod = _module_of(path)
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out += [(mod, a.name) for a in node.names if a.name.startswith("miso")]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                if target.startswith("miso"):
                    out.append((mod, target))
    return out


def upward() -> set[tuple[str, str]]:
    bad = set()
    for src, dst in imports():
        a, b = _top(src), _top(dst)
        if a is None or b is None or a == b:
            continue
        assert a in LAYERS, f"miso.{a} has no layer in tests/test_layers.py LAYERS"
        assert b in LAYERS, f"miso.{b} has no layer in tests/test_layers.py LAYERS"
        if LAYERS[b] > LAYERS[a]:
            bad.add((src, dst))
    return bad


def test_layer_no_upward_import() -> None:
    bad = upward()
    new = sorted(bad - KNOWN)
    assert not new, "upward imports (a lower layer importing a higher one):\n" + "\n".join(
        f"  {a} -> {b}" for a, b in new)
    gone = sorted(KNOWN - bad)
    assert not gone, f"remove from KNOWN (fixed): {gone}"


def test_layer_walk_sees_imports() -> None:
    """The walk itself: it finds the core's imports of lower layers (a walk that saw nothing
    would pass the test above)."""
    got = imports()
    assert ("miso.sched.policies.baselines", "miso.mig") in got
    assert any(a.startswith("miso.cli") and b.startswith("miso.controller") for a, b in got)


def test_policy_classes_have_at_most_two_bases() -> None:
    wide = []
    for path in sorted((SRC / "sched" / "policies").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and len(node.bases) > 2:
                wide.append(f"{path.name}:{node.name} ({len(node.bases)} bases)")
    assert not wide, f"classes with more than two bases: {wide}"


#: The node protocol's types and their one low home (below agent, transport and controller).
NODE_PROTOCOL = {"NodeUnavailable": "miso.nodeerrors", "AttemptStatus": "miso.attemptstatus",
                 "layout_data": "miso.nodewire", "placement_of": "miso.nodewire",
                 "attempt_dir": "miso.nodewire", "exit_record_path": "miso.nodewire"}


def test_layer_node_protocol_imported_from_its_home() -> None:
    """Agent, transport and controller take the node protocol's types from their home, not
    from one another (the packages' own re-exports for outside callers aside)."""
    reexports = {"miso.transport", "miso.transport.base", "miso.agent"}
    bad, seen = [], 0
    for path in sorted(SRC.rglob("*.py")):
        mod = _module_of(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or mod in reexports:
                continue
            for a in node.names:
                home = NODE_PROTOCOL.get(a.name)
                if home is not None and (node.module or "").startswith("miso"):
                    seen += 1
                    if node.module != home:
                        bad.append(f"{mod}: {a.name} from {node.module} (home: {home})")
    assert seen > 10, seen  # the walk sees the imports (agent, controller, transport)
    assert not bad, "\n".join(bad)
