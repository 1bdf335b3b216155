"""``miso doctor`` on the pynvml fake: a match, tables that disagree, no driver, read-only."""

from __future__ import annotations

import json
import sys

import pytest
from fakenvml import FakeNvml
from typer.testing import CliRunner

from miso.cli import app
from miso.cli.doctor import collect, reconfigure_permission, run
from miso.mig import GPU_MODELS

runner = CliRunner()
MUTATING = ("Set", "Create", "Destroy", "Reset", "Clear")


def _doctor(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, *args: str):
    """Run the real ``miso doctor`` command with ``import pynvml`` answering the fake."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return runner.invoke(app, ["doctor", *args])


@pytest.mark.parametrize("model", list(GPU_MODELS))
def test_every_model_matches_its_own_table(model: str) -> None:
    fake = FakeNvml(2, model, driver="595.58.03")
    rep = collect(fake, which=lambda _: None, permission=lambda: (False, "test"))
    assert [g.model for g in rep.gpus] == [model, model]
    assert rep.mismatches == 0, [g.mismatches for g in rep.gpus]
    # every profile of the table came back from NVML with its placements
    assert len(rep.gpus[0].profiles) == len(GPU_MODELS[model].profiles)
    assert all(p.starts and p.size for p in rep.gpus[0].profiles)


def test_match_exits_zero_with_versions_modes_and_profiles(monkeypatch) -> None:
    fake = FakeNvml(1, "A100-40GB", driver="550.54.15", nvml_version="12.550.54.15",
                    mig_enabled=True, pending_mig=False)
    r = _doctor(monkeypatch, fake, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["ok"] is True
    assert out["driver_version"] == "550.54.15" and out["nvml_version"] == "12.550.54.15"
    assert isinstance(out["can_reconfigure"], bool) and out["reconfigure_reason"]
    assert "mps_control" in out
    gpu = out["gpus"][0]
    assert gpu["model"] == "A100-40GB" and gpu["pci_device_id"] == "0x20B0"
    assert (gpu["mig_current"], gpu["mig_pending"]) == (True, False)
    assert any("pending" in n for n in gpu["notes"])
    by = {p["name"]: p for p in gpu["profiles"]}
    assert by["3g.20gb"]["profile_id"] == 9 and by["3g.20gb"]["starts"] == [0, 4]
    assert by["1g.10gb"]["size"] == 2 and by["1g.10gb"]["starts"] == [0, 2, 4, 6]
    assert gpu["mismatches"] == []
    text = _doctor(monkeypatch, FakeNvml(1, "A100-40GB"))
    assert text.exit_code == 0 and "all profiles match" in text.stdout


def test_tables_that_disagree_are_listed_entry_by_entry(monkeypatch) -> None:
    fake = FakeNvml(1, "H100-80GB")
    fake.report_profile("3g.40gb", sm_count=48, starts=(0,))
    fake.report_profile("1g.10gb", profile_id=23, name="1g.11gb")
    fake.report_profile("7g.80gb", memory_gib=78.0, max_count=2)
    fake.hide_profile("2g.20gb")
    fake.report_profile("1g.20gb", nvml_index=17)  # an index the table does not have
    r = _doctor(monkeypatch, fake, "--json")
    assert r.exit_code == 1
    mism = json.loads(r.stdout)["gpus"][0]["mismatches"]
    want = ["3g.40gb: SM count is 48 on NVML, 60", "3g.40gb: placements are {0}:4 on NVML, "
            "{0,4}:4", "1g.10gb: name is 1g.11gb", "1g.10gb: profile id is 23 on NVML, 19",
            "7g.80gb: memory is 78.00 GiB on NVML, 79.25", "7g.80gb: instance count is 2",
            "the table has 2g.20gb (index 1, id 14) but NVML does not report it",
            "NVML reports profile 1g.20gb (index 17, id 15)",
            "the table has 1g.20gb (index 9, id 15) but NVML does not report it"]
    for w in want:
        assert any(m.startswith(w) for m in mism), (w, mism)
    assert len(mism) == len(want)
    text = _doctor(monkeypatch, fake)
    assert text.exit_code == 1 and "9 mismatches with miso's tables" in text.stdout


def test_mismatch_on_an_inferred_value_says_so() -> None:
    fake = FakeNvml(1, "H200-141GB")
    fake.report_profile("3g.71gb", starts=(0, 2, 4))
    rep = collect(fake, which=lambda _: None, permission=lambda: (False, "test"))
    (m,) = rep.gpus[0].mismatches
    assert m.endswith("(inferred in the table)")


def test_no_driver_is_one_line_and_exit_two(monkeypatch) -> None:
    r = _doctor(monkeypatch, FakeNvml(driver_loaded=False), "--json")
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no NVIDIA driver")
    assert run(FakeNvml(driver_loaded=False), json_out=False) == 2


def test_doctor_never_changes_a_setting() -> None:
    fake = FakeNvml(2, "RTX-PRO-6000", mig_enabled=False, pending_mig=True)
    rep = collect(fake, which=lambda _: "/usr/bin/nvidia-cuda-mps-control",
                  permission=lambda: (True, "root"))
    assert rep.mps_control == "/usr/bin/nvidia-cuda-mps-control" and rep.can_reconfigure
    assert not [c for c in fake.calls if any(w in c for w in MUTATING)]
    assert "nvmlShutdown" in fake.calls


def test_profiles_of_a_newer_driver_are_expected_missing_on_an_old_one() -> None:
    # R460: no 1g.5gb+me (R470) and no 1g.10gb (R525) -- notes, not mismatches
    fake = FakeNvml(1, "A100-40GB", driver="460.32.03")
    g = collect(fake, which=lambda _: None, permission=lambda: (False, "t")).gpus[0]
    assert g.mismatches == []
    assert any("1g.5gb+me" in n and "R470" in n for n in g.notes)
    assert any("1g.10gb" in n and "R525" in n for n in g.notes)
    assert not any("older than" in n for n in g.notes)  # A100's minimum is 450.80.02
    old = FakeNvml(1, "B300-288GB", driver="570.133.20")
    notes = collect(old, which=lambda _: None, permission=lambda: (False, "t")).gpus[0].notes
    assert any("older than the MIG user guide's minimum 580.82.07" in n for n in notes)


def test_models_known_by_name_only_are_detected() -> None:
    fake = FakeNvml(1, "RTX-PRO-5000")
    g = collect(fake, which=lambda _: None, permission=lambda: (False, "t")).gpus[0]
    assert g.model == "RTX-PRO-5000" and g.name == "NVIDIA RTX PRO 5000 Blackwell"


def test_reconfigure_permission(tmp_path) -> None:
    assert reconfigure_permission(tmp_path, euid=lambda: 0) == (True, "running as root")
    ok, why = reconfigure_permission(tmp_path, euid=lambda: 1000)
    assert not ok and "not readable" in why
    cap = tmp_path / "proc/driver/nvidia/capabilities/mig"
    cap.mkdir(parents=True)
    (cap / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\n")
    ok, why = reconfigure_permission(tmp_path, euid=lambda: 1000)
    assert not ok and "nvidia-cap1" in why
    dev = tmp_path / "dev/nvidia-caps"
    dev.mkdir(parents=True)
    (dev / "nvidia-cap1").write_text("")
    ok, why = reconfigure_permission(tmp_path, euid=lambda: 1000)
    assert ok and "mig/config capability" in why


def test_nvml_backend_also_detects_models_known_by_name_only() -> None:
    from miso.backend.nvml import NvmlBackend

    be = NvmlBackend(nvml=FakeNvml(1, "RTX-PRO-4500"))
    assert be.gpus()[0].model == "RTX-PRO-4500"
    assert {p.name for p in be.geometry(0).profiles} == {"1g.16gb", "2g.32gb"}


def test_an_nvml_error_on_one_gpu_is_reported_not_raised(monkeypatch) -> None:
    import pynvml

    fake = FakeNvml(2, "A30-24GB")
    fake.fail_next("nvmlDeviceGetPciInfo", pynvml.NVML_ERROR_UNKNOWN)
    r = _doctor(monkeypatch, fake, "--json")
    assert r.exit_code == 1
    gpus = json.loads(r.stdout)["gpus"]
    assert gpus[0]["mismatches"][0].startswith("NVML failed while reading GPU 0")
    assert gpus[1]["model"] == "A30-24GB" and gpus[1]["mismatches"] == []
