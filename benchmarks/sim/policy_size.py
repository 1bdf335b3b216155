"""How large miso+'s shipped code is (issue 27: "miso+'s shipped code <= 1,000 lines across its
plugins").

    python benchmarks/sim/policy_size.py [--policy miso+] [--max-sloc 1000] [--json FILE]

The files are derived, not listed by hand: the modules the policy's module imports (an ``ast``
walk of its imports, transitively, ``TYPE_CHECKING`` blocks left out) minus those any other
shipped profile's module imports (MISO's own code, the baselines' and the framework: code
``miso+`` shares is not ``miso+``'s). They are reported in two groups: the policy package
(``miso.sched.policies``: miso+'s plugins, what the target counts) and the other modules of
``miso.sched`` only miso+ loads (reported beside it). Per file and per class: physical lines
(``wc -l``) and radon's raw source lines (``radon.raw.analyze(text).sloc``: no blank lines,
comments or docstrings). ``--max-sloc N`` exits 1 when the policy package's SLOC exceed N.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from radon.raw import analyze

SRC = Path(__file__).resolve().parents[2] / "src"
PLUGINS = "miso.sched.policies"


def module_file(mod: str) -> Path | None:
    p = SRC.joinpath(*mod.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def imports(mod: str) -> set[str]:
    """The ``miso`` modules ``mod`` imports at run time (packages and submodules)."""
    f = module_file(mod)
    assert f is not None, mod
    pkg = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(f.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if not base.startswith("miso"):
                continue
            subs = {m for a in node.names if module_file(m := f"{base}.{a.name}")}
            out |= subs
            # ``from pkg import sub`` loads the submodule; the package counts only when a name
            # that is not a submodule is taken from it (as ``from pkg.sub import x`` does not
            # count ``pkg``): else ``from miso.sched import fairorder`` would pull in
            # ``miso.sched``'s ``__init__`` and with it every profile.
            if module_file(base) and len(subs) < len(node.names):
                out.add(base)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names
                    if a.name.startswith("miso") and module_file(a.name)}
    return out


def closure(mod: str) -> set[str]:
    seen: set[str] = set()
    todo = [mod]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(imports(m))
    return seen


def shipped_modules() -> dict[str, str]:
    """Shipped profile name -> the module of its policy class."""
    from miso.sched.policies import PROFILES

    return {name: p.policy.__module__ for name, p in PROFILES.items()}


def own_modules(policy: str) -> list[str]:
    """Modules ``policy``'s module loads that no other shipped profile's module loads (the
    policy table itself, which imports every profile, left out)."""
    mods = shipped_modules()
    own = closure(mods[policy])
    for mod in set(mods.values()) - {mods[policy]}:
        own -= closure(mod)
    own.discard(PLUGINS)
    if mods[policy] not in own:
        raise SystemExit(f"{mods[policy]} is loaded by another shipped profile's module: the "
                         "derived list would be empty or wrong")
    return sorted(own)


def sizes(path: Path) -> dict[str, object]:
    """Physical lines and radon SLOC of the file, and of each top-level class in it."""
    text = path.read_text()
    lines = text.splitlines()
    classes = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            body = "\n".join(lines[first - 1:node.end_lineno])
            classes[node.name] = {"lines": node.end_lineno - first + 1,  # type: ignore[operator]
                                  "sloc": analyze(body).sloc}
    return {"lines": len(lines), "sloc": analyze(text).sloc, "classes": classes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="miso+")
    ap.add_argument("--max-sloc", type=int, default=None,
                    help="exit 1 when the policy package's SLOC exceed this")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    a = ap.parse_args()
    groups: dict[str, dict[str, dict[str, object]]] = {"plugins": {}, "other": {}}
    for mod in own_modules(a.policy):
        f = module_file(mod)
        assert f is not None
        group = "plugins" if mod.startswith(PLUGINS + ".") else "other"
        groups[group][str(f.relative_to(SRC.parent))] = sizes(f)
    totals = {}
    for group, files in groups.items():
        title = f"{PLUGINS} (miso+'s plugins)" if group == "plugins" else \
            "other miso modules only this policy loads"
        print(f"## {a.policy}: {title}")
        print(f"{'file / class':56} {'lines':>6} {'sloc':>6}")
        for f, s in files.items():
            print(f"{f:56} {s['lines']:>6} {s['sloc']:>6}")
            for c, cs in s["classes"].items():  # type: ignore[attr-defined]
                print(f"  {c:54} {cs['lines']:>6} {cs['sloc']:>6}")
        tot = {"lines": sum(s["lines"] for s in files.values()),  # type: ignore[misc]
               "sloc": sum(s["sloc"] for s in files.values())}  # type: ignore[misc]
        totals[group] = tot
        print(f"{'total':56} {tot['lines']:>6} {tot['sloc']:>6}\n")
    if a.json:
        Path(a.json).write_text(json.dumps({"policy": a.policy, "totals": totals,
                                            "files": groups}, indent=1) + "\n")
    if a.max_sloc is not None and totals["plugins"]["sloc"] > a.max_sloc:
        print(f"FAIL: {a.policy}'s plugins have {totals['plugins']['sloc']} source lines "
              f"(radon SLOC), over {a.max_sloc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
