"""GPU backends: one contract suite over the emulated and the NVML backend (on a pynvml fake),
plus NVML-specific error mapping and emulated-specific behaviour (real processes, faults, MPS)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fakenvml import FakeNvml

from miso.backend import (
    EmulatedBackend,
    InstanceInUse,
    InsufficientResources,
    InvalidPlacement,
    NotFound,
    NotSupported,
    ReconfigurationError,
)
from miso.backend.mps import MpsManager
from miso.backend.nvml import NvmlBackend
from miso.mig import Placement, enumerate_layouts, geometry, violations

P = Placement


class _Nvml:
    """Backend + fake, with a way to pretend a process uses an instance."""

    def __init__(self, model: str = "A100-40GB", **kw: object) -> None:
        self.fake = FakeNvml(2, model, **kw)  # type: ignore[arg-type]
        self.backend = NvmlBackend(nvml=self.fake, mps=MpsManager(runner=lambda *a: 0))

    def use(self, gpu: int, pl: Placement) -> None:
        self.fake.add_process(gpu, pl.start, 4242)

    def release(self) -> None:
        self.fake.clear_processes()


class _Emu:
    def __init__(self, model: str = "A100-40GB", **kw: object) -> None:
        self.backend = EmulatedBackend(2, model, **kw)  # type: ignore[arg-type]
        self.procs: list[subprocess.Popen[bytes]] = []

    def use(self, gpu: int, pl: Placement) -> None:
        env = {**os.environ, **self.backend.job_env(gpu, pl)}
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        self.procs.append(p)
        deadline = time.time() + 10
        while not self.backend.processes(gpu, pl) and time.time() < deadline:
            time.sleep(0.02)

    def release(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs.clear()


@pytest.fixture(params=["emulated", "nvml"])
def hw(request: pytest.FixtureRequest):  # noqa: ANN201
    h = _Emu() if request.param == "emulated" else _Nvml()
    yield h
    h.release()


# ---- contract suite -------------------------------------------------------------------------


def test_contract__starts_empty_with_mig_on(hw) -> None:  # noqa: ANN001
    b = hw.backend
    assert [g.index for g in b.gpus()] == [0, 1]
    assert all(g.mig_enabled and g.model == "A100-40GB" for g in b.gpus())
    assert b.read_layout(0) == ()


def test_contract__possible_placements_match_table(hw) -> None:  # noqa: ANN001
    pp = hw.backend.possible_placements(0)
    assert pp["1g.5gb"] == (0, 1, 2, 3, 4, 5, 6)
    assert pp["3g.20gb"] == (0, 4)
    assert pp["7g.40gb"] == (0,)


def test_contract__every_maximal_layout_round_trips(hw) -> None:  # noqa: ANN001
    b = hw.backend
    geom = b.geometry(0)
    for lay in enumerate_layouts(geom, maximal=True):
        assert b.apply_layout(0, lay) == lay
        assert b.read_layout(0) == lay
        devs = b.devices(0)
        assert set(devs) == set(lay)
        assert all(d.uuid.startswith("MIG-") for d in devs.values())
        assert len({d.uuid for d in devs.values()}) == len(lay)
    assert b.apply_layout(0, ()) == ()


def test_contract__kept_instances_keep_their_uuid(hw) -> None:  # noqa: ANN001
    b = hw.backend
    b.apply_layout(0, (P(0, "4g.20gb"), P(4, "2g.10gb"), P(6, "1g.5gb")))
    before = b.devices(0)[P(0, "4g.20gb")].uuid
    b.apply_layout(0, (P(0, "4g.20gb"), P(4, "3g.20gb")))
    assert b.devices(0)[P(0, "4g.20gb")].uuid == before


def test_contract__overlap_is_refused(hw) -> None:  # noqa: ANN001
    b = hw.backend
    b.create(0, P(0, "4g.20gb"))
    with pytest.raises(InsufficientResources):
        b.create(0, P(2, "2g.10gb"))
    assert b.read_layout(0) == (P(0, "4g.20gb"),)


def test_contract__illegal_start_is_refused(hw) -> None:  # noqa: ANN001
    with pytest.raises(InvalidPlacement):
        hw.backend.create(0, P(2, "3g.20gb"))


def test_contract__unknown_profile_is_not_supported(hw) -> None:  # noqa: ANN001
    with pytest.raises(NotSupported):
        hw.backend.create(0, P(0, "5g.25gb"))


def test_contract__destroying_missing_instance_is_not_found(hw) -> None:  # noqa: ANN001
    with pytest.raises(NotFound):
        hw.backend.destroy(0, P(0, "7g.40gb"))


def test_contract__instance_in_use_cannot_be_destroyed(hw) -> None:  # noqa: ANN001
    b = hw.backend
    b.apply_layout(0, (P(0, "3g.20gb"), P(4, "3g.20gb")))
    hw.use(0, P(4, "3g.20gb"))
    assert b.processes(0, P(4, "3g.20gb"))
    with pytest.raises(InstanceInUse):
        b.destroy(0, P(4, "3g.20gb"))
    # A failed reconfiguration reports the layout the GPU really holds (valid by construction).
    with pytest.raises(ReconfigurationError) as ei:
        b.apply_layout(0, (P(0, "7g.40gb"),))
    assert ei.value.kind == "IN_USE"
    assert ei.value.layout == (P(4, "3g.20gb"),)
    assert not violations(geometry("A100-40GB"), ei.value.layout)
    hw.release()
    assert b.apply_layout(0, (P(0, "7g.40gb"),)) == (P(0, "7g.40gb"),)


def test_contract__gpus_are_independent(hw) -> None:  # noqa: ANN001
    b = hw.backend
    b.apply_layout(0, (P(0, "7g.40gb"),))
    b.apply_layout(1, (P(0, "1g.5gb"),))
    assert b.read_layout(0) == (P(0, "7g.40gb"),)
    assert b.read_layout(1) == (P(0, "1g.5gb"),)


def test_contract__invalid_target_is_rejected_before_touching_the_gpu(hw) -> None:  # noqa: ANN001
    b = hw.backend
    b.apply_layout(0, (P(0, "7g.40gb"),))
    with pytest.raises(InvalidPlacement):
        b.apply_layout(0, (P(0, "4g.20gb"), P(2, "2g.10gb")))
    assert b.read_layout(0) == (P(0, "7g.40gb"),)


def test_contract__job_env_pins_the_mig_uuid(hw) -> None:  # noqa: ANN001
    b = hw.backend
    b.apply_layout(0, (P(0, "3g.20gb"),))
    env = b.job_env(0, P(0, "3g.20gb"))
    assert env["CUDA_VISIBLE_DEVICES"] == b.devices(0)[P(0, "3g.20gb")].uuid
    with pytest.raises(NotFound):
        b.job_env(0, P(4, "3g.20gb"))


def test_contract__mps_daemon_has_own_directories(hw, tmp_path) -> None:  # noqa: ANN001
    b = hw.backend
    b.apply_layout(0, (P(0, "7g.40gb"),))
    h = b.start_mps(0, P(0, "7g.40gb"), str(tmp_path))
    assert os.path.isdir(h.pipe_dir) and os.path.isdir(h.log_dir)
    assert h.pipe_dir != h.log_dir
    b.stop_mps(h)


# ---- NVML specifics -------------------------------------------------------------------------


def test_nvml__uses_explicit_placement_and_destroys_ci_before_gi() -> None:
    h = _Nvml()
    h.backend.apply_layout(0, (P(4, "3g.20gb"),))
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" in h.fake.calls
    assert "nvmlDeviceCreateGpuInstance" not in h.fake.calls
    h.fake.calls.clear()
    h.backend.apply_layout(0, ())
    ci = h.fake.calls.index("nvmlComputeInstanceDestroy")
    gi = h.fake.calls.index("nvmlGpuInstanceDestroy")
    assert ci < gi


def test_nvml__mig_disabled_is_not_supported() -> None:
    h = _Nvml(mig_enabled=False)
    assert not h.backend.gpus()[0].mig_enabled
    with pytest.raises(NotSupported):
        h.backend.create(0, P(0, "7g.40gb"))


@pytest.mark.parametrize("err,exc", [
    ("NVML_ERROR_IN_USE", InstanceInUse),
    ("NVML_ERROR_INSUFFICIENT_RESOURCES", InsufficientResources),
    ("NVML_ERROR_NOT_SUPPORTED", NotSupported),
])
def test_nvml__error_codes_map_to_backend_errors(err: str, exc: type) -> None:
    h = _Nvml()
    h.fake.fail_next("nvmlDeviceCreateGpuInstanceWithPlacement", getattr(h.fake, err))
    with pytest.raises(exc):
        h.backend.create(0, P(0, "7g.40gb"))
    assert h.backend.read_layout(0) == ()


def test_nvml__failed_compute_instance_leaves_no_gpu_instance() -> None:
    h = _Nvml()
    h.fake.fail_next("nvmlGpuInstanceCreateComputeInstance",
                     h.fake.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(InsufficientResources):
        h.backend.create(0, P(0, "3g.20gb"))
    assert h.backend.read_layout(0) == ()


def test_nvml__model_from_pci_id_and_profiles_from_nvml() -> None:
    h = _Nvml("H100-80GB")
    assert h.backend.geometry(0).model.name == "H100-80GB"
    assert h.backend.possible_placements(0)["1g.20gb"] == (0, 2, 4, 6)


def test_nvml__old_driver_refuses_4g_with_3g() -> None:
    h = _Nvml(driver="470.82.01")
    assert h.backend.geometry(0).legacy_ban
    with pytest.raises(InvalidPlacement):  # caught by validation before any NVML call
        h.backend.apply_layout(0, (P(0, "4g.20gb"), P(4, "3g.20gb")))
    h.backend.create(0, P(0, "4g.20gb"))
    with pytest.raises(InsufficientResources):  # and NVML refuses it too
        h.backend.create(0, P(4, "3g.20gb"))


def test_mps_manager__runs_control_with_own_pipe_and_log_dirs(tmp_path) -> None:
    calls = []

    def runner(cmd, env, stdin):  # noqa: ANN001, ANN202
        calls.append((list(cmd), dict(env), stdin))
        return 0

    m = MpsManager(runner=runner)
    h = m.start(0, P(0, "7g.40gb"), "MIG-abc", str(tmp_path))
    m.stop(h)
    (start_cmd, env, _), (stop_cmd, env2, stdin) = calls
    assert start_cmd == ["nvidia-cuda-mps-control", "-d"]
    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-abc"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == h.pipe_dir
    assert env["CUDA_MPS_LOG_DIRECTORY"] == h.log_dir
    assert stop_cmd == ["nvidia-cuda-mps-control"] and stdin == "quit\n"
    assert env2["CUDA_MPS_PIPE_DIRECTORY"] == h.pipe_dir


# ---- emulated specifics ---------------------------------------------------------------------


def test_emulated__fault_injection_leaves_a_valid_known_layout() -> None:
    b = EmulatedBackend(1)
    b.apply_layout(0, (P(0, "4g.20gb"), P(4, "3g.20gb")))
    b.fail_next("create", "INSUFFICIENT_RESOURCES")
    with pytest.raises(ReconfigurationError) as ei:
        b.apply_layout(0, (P(0, "2g.10gb"), P(2, "2g.10gb"), P(4, "3g.20gb")))
    assert ei.value.layout == b.read_layout(0)
    assert not violations(b.geometry(0), ei.value.layout)
    for _gpu, lay in b.history:
        assert not violations(b.geometry(0), lay)


def test_emulated__env_tells_the_process_its_profile() -> None:
    b = EmulatedBackend(1, "H100-80GB")
    b.apply_layout(0, (P(0, "3g.40gb"),))
    env = b.job_env(0, P(0, "3g.40gb"))
    assert env["MISO_EMULATED_PROFILE"] == "3g.40gb"
    assert env["MISO_EMULATED_COMPUTE_SLICES"] == "3"
    assert env["MISO_EMULATED_GPU_MODEL"] == "H100-80GB"


def test_emulated__mig_disabled_gpu() -> None:
    b = EmulatedBackend(2, mig_disabled=(1,))
    assert [g.mig_enabled for g in b.gpus()] == [True, False]
    with pytest.raises(NotSupported):
        b.create(1, P(0, "7g.40gb"))
