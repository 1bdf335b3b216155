"""The base install has no PyTorch: every command but `miso predictor train` runs without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: The only modules that may import torch (training); everything else must import without it.
TORCH_MODULES = {"miso.predict.model", "miso.predict.train"}

_NO_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
sys.meta_path.insert(0, _NoTorch())
for m in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
    del sys.modules[m]
"""


def _run_without_torch(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _NO_TORCH + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_torch_is_an_optional_extra_only() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in meta["dependencies"] if d.lower().startswith("torch")]
    assert any(d.startswith("torch") for d in meta["optional-dependencies"]["train"])


def test_every_module_but_training_imports_without_torch() -> None:
    r = _run_without_torch(f"""
        import pkgutil, importlib, miso
        skip = {sorted(TORCH_MODULES)!r}
        names = [m.name for m in pkgutil.walk_packages(miso.__path__, "miso.")]
        for n in names:
            if n not in skip and not n.endswith(".__main__"):
                importlib.import_module(n)
        assert "torch" not in sys.modules
        print(len(names))
    """)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) > 50


def test_train_without_torch_names_the_extra(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    f = tmp_path / "d.npz"
    np.savez(f, mps=rng.uniform(0.1, 1, (8, 3, 7)).astype(np.float32),
             mig=rng.uniform(0.1, 1, (8, 3, 7)).astype(np.float32), mix_id=np.arange(8))
    r = _run_without_torch(f"""
        from miso.cli import app
        app(["predictor", "train", "--kind", "unet", "--data", {str(f)!r},
             "--out", {str(tmp_path / "m")!r}],
            prog_name="miso")
    """)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training needs PyTorch")
    assert 'pip install -e ".[train]"' in lines[0]
