"""MIG hardware model: enumeration counts, placement rules, validation and transitions."""

from __future__ import annotations

import pytest

from miso.mig import (
    GPU_MODELS,
    Placement,
    TransitionError,
    enumerate_layouts,
    geometry,
    gpu_model,
    is_valid,
    multisets,
    plan_transition,
    violations,
)

A100_PAPER = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def P(spec: str) -> Placement:
    prof, start = spec.split("@")
    return Placement(int(start), prof)


def L(*specs: str) -> tuple[Placement, ...]:
    return tuple(sorted(P(s) for s in specs))


@pytest.mark.parametrize(
    ("driver", "all_", "maximal", "maximal_multisets", "all_multisets"),
    [(470, 296, 18, 13, 36), (535, 297, 19, 14, 37)],
)
def test_a100_counts_match_paper_and_driver_rule(driver, all_, maximal, maximal_multisets,
                                                 all_multisets):
    g = geometry("A100-40GB", A100_PAPER, driver)
    assert len(enumerate_layouts(g)) == all_
    assert len(enumerate_layouts(g, maximal=True)) == maximal
    assert len(multisets(g, maximal=True)) == maximal_multisets
    assert len(multisets(g)) == all_multisets


def test_a100_eighteen_layouts_are_exactly_the_known_list():
    g = geometry("A100-40GB", A100_PAPER, 470)
    lefts = [("4g.20gb@0",), ("3g.20gb@0",), ("2g.10gb@0", "2g.10gb@2"),
             ("2g.10gb@0", "1g.5gb@2", "1g.5gb@3"), ("1g.5gb@0", "1g.5gb@1", "2g.10gb@2"),
             ("1g.5gb@0", "1g.5gb@1", "1g.5gb@2", "1g.5gb@3")]
    rights = [("3g.20gb@4",), ("2g.10gb@4", "1g.5gb@6"), ("1g.5gb@4", "1g.5gb@5", "1g.5gb@6")]
    expected = {L(*a, *b) for a in lefts for b in rights if not (a == lefts[0] and b == rights[0])}
    expected.add(L("7g.40gb@0"))
    assert set(enumerate_layouts(g, maximal=True)) == expected


def test_a100_with_double_memory_1g_counts():
    g = geometry("A100-40GB", ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"])
    assert len(enumerate_layouts(g, maximal=True)) == 78
    assert len(multisets(g, maximal=True)) == 38


def test_double_memory_1g_needs_r525():
    with pytest.raises(ValueError, match="R525"):
        geometry("A100-40GB", ["1g.10gb"], driver=470)


@pytest.mark.parametrize(
    ("model", "maximal", "maximal_multisets"),
    [("A30-24GB", 5, 4), ("RTX-PRO-6000", 5, 4), ("H100-80GB", 19, 14), ("H100-PCIE-80GB", 19, 14),
     ("H100-94GB", 19, 14), ("H200-141GB", 19, 14), ("B200-180GB", 19, 14), ("A100-80GB", 19, 14)],
)
def test_other_gpu_counts(model, maximal, maximal_multisets):
    g = geometry(model)
    assert len(enumerate_layouts(g, maximal=True)) == maximal
    assert len(multisets(g, maximal=True)) == maximal_multisets


@pytest.mark.parametrize("model", list(GPU_MODELS))
def test_every_layout_is_valid_and_within_compute(model):
    m = gpu_model(model)
    g = geometry(m)
    comp = {p.name: p.compute_slices for p in m.profiles}
    for lay in enumerate_layouts(g):
        assert is_valid(g, lay)
        assert sum(comp[pl.profile] for pl in lay) <= m.compute_slices
        assert len(lay) <= m.max_instances


@pytest.mark.parametrize("model", list(GPU_MODELS))
def test_maximal_layouts_cannot_be_extended(model):
    g = geometry(model)
    all_ = set(enumerate_layouts(g))
    for lay in enumerate_layouts(g, maximal=True):
        for cand, _ in g.candidates():
            assert tuple(sorted((*lay, cand))) not in all_


def test_placement_units_are_per_model():
    assert gpu_model("A30").units == 4
    assert gpu_model("RTX-PRO-6000").units == 12
    rtx = geometry("RTX-PRO-6000")
    # 4 x 1g.24gb at {0,3,6,9}, each 3 units wide, fill all 12 units.
    assert L("1g.24gb@0", "1g.24gb@3", "1g.24gb@6", "1g.24gb@9") in enumerate_layouts(rtx,
                                                                                     maximal=True)
    assert is_valid(rtx, L("2g.48gb@6", "1g.24gb@0", "1g.24gb@3"))


def test_profile_ids_are_per_device():
    assert gpu_model("A100-40GB").profile("2g.10gb").profile_id == 14
    assert gpu_model("A30").profile("1g.6gb").profile_id == 14
    assert gpu_model("RTX-PRO-6000").profile("1g.24gb").profile_id == 14
    h100 = gpu_model("H100-80GB")
    assert h100.profile("7g.80gb").sm_count == 132 and h100.profile("3g.40gb").sm_count == 60
    assert gpu_model("H100-PCIE-80GB").profile("7g.80gb").sm_count == 114


def test_violations_explain_each_rule():
    g = geometry("A100-40GB", A100_PAPER, 470)
    assert any("overlaps" in v for v in violations(g, L("4g.20gb@0", "2g.10gb@2")))
    assert any("start 1 not allowed" in v for v in violations(g, L("2g.10gb@1")))
    assert any("exceed the maximum of 1" in v for v in violations(g, [P("4g.20gb@0"),
                                                                      P("4g.20gb@0")]))
    assert any("R510" in v for v in violations(g, L("4g.20gb@0", "3g.20gb@4")))
    assert any("no profile" in v for v in violations(g, L("5g.30gb@0")))
    assert violations(geometry("A100-40GB", A100_PAPER, 535), L("4g.20gb@0", "3g.20gb@4")) == []


def test_transition_keeps_untouched_jobs_and_orders_creates():
    g = geometry("A100-40GB")
    cur_layout = L("3g.20gb@0", "2g.10gb@4", "1g.5gb@6")
    cur_jobs = {"a": P("3g.20gb@0"), "b": P("2g.10gb@4"), "c": P("1g.5gb@6")}
    tgt_layout = L("3g.20gb@0", "3g.20gb@4")
    tgt_jobs = {"a": P("3g.20gb@0"), "b": P("3g.20gb@4")}
    plan = plan_transition(g, cur_layout, cur_jobs, tgt_layout, tgt_jobs)
    assert plan.untouched == ("a",)
    assert plan.keep == (P("3g.20gb@0"),)
    assert set(plan.destroy) == {P("2g.10gb@4"), P("1g.5gb@6")}
    assert plan.create == (P("3g.20gb@4"),)
    assert plan.checkpoint == ("b", "c")
    assert plan.start == (("b", P("3g.20gb@4")),)


def test_transition_swap_on_kept_instances_restarts_both():
    g = geometry("A100-40GB")
    lay = L("4g.20gb@0", "3g.20gb@4")
    plan = plan_transition(g, lay, {"a": P("4g.20gb@0"), "b": P("3g.20gb@4")}, lay,
                           {"a": P("3g.20gb@4"), "b": P("4g.20gb@0")})
    assert plan.destroy == () and plan.create == ()
    assert plan.checkpoint == ("a", "b") and plan.untouched == ()


def test_transition_noop():
    g = geometry("A100-40GB")
    lay = L("7g.40gb@0")
    assert plan_transition(g, lay, {"a": lay[0]}, lay, {"a": lay[0]}).is_noop


def test_transition_rejects_invalid_target():
    g = geometry("A100-40GB")
    with pytest.raises(TransitionError, match="overlaps"):
        plan_transition(g, (), {}, L("4g.20gb@0", "2g.10gb@2"), {})
    with pytest.raises(TransitionError, match="not in the target"):
        plan_transition(g, (), {}, L("7g.40gb@0"), {"a": P("3g.20gb@0")})


# ---- every model: profile count, enumeration counts (default profiles), minimum driver ----------

# model: (profiles, valid layouts, maximal layouts, maximal multisets, MIG user guide min driver)
EVERY_MODEL = {
    "A100-40GB": (7, 297, 19, 14, "450.80.02"),
    "A100-80GB": (7, 297, 19, 14, "450.80.02"),
    "A30-24GB": (5, 25, 5, 4, "460.73.01"),
    "H100-80GB": (7, 297, 19, 14, "525.85.12"),
    "H100-PCIE-80GB": (7, 297, 19, 14, "525.85.12"),
    "H100-94GB": (7, 297, 19, 14, "525.85.12"),
    "H100-96GB": (7, 297, 19, 14, "525.85.12"),
    "GH200-144GB": (7, 297, 19, 14, ""),
    "H200-141GB": (7, 297, 19, 14, "550.90.07"),
    "B200-180GB": (7, 297, 19, 14, "570.133.20"),
    "GB200-186GB": (7, 297, 19, 14, "570.133.20"),
    "B300-288GB": (7, 297, 19, 14, "580.82.07"),
    "GB300-288GB": (7, 297, 19, 14, "595.58.03"),
    "RTX-PRO-6000": (11, 25, 5, 4, "575.51.03"),
    "RTX-PRO-5000": (7, 4, 2, 2, "575.57.08"),
    "RTX-PRO-4500": (6, 4, 2, 2, "575.64"),
}


def test_every_model_is_counted():
    assert set(EVERY_MODEL) == set(GPU_MODELS)


@pytest.mark.parametrize("model", list(EVERY_MODEL))
def test_every_model_profiles_layouts_and_min_driver(model):
    n_prof, valid, maximal, msets, min_drv = EVERY_MODEL[model]
    m = gpu_model(model)
    g = geometry(m)
    assert len(m.profiles) == n_prof
    assert len(enumerate_layouts(g)) == valid
    assert len(enumerate_layouts(g, maximal=True)) == maximal
    assert len(multisets(g, maximal=True)) == msets
    assert m.min_driver == min_drv
    assert m.sources, "every model cites its sources"
    assert len({p.nvml_index for p in m.profiles}) == n_prof
    assert len({p.profile_id for p in m.profiles}) == n_prof


@pytest.mark.parametrize(("model", "me"), [("A100-40GB", "1g.5gb+me"), ("A100-80GB", "1g.10gb+me"),
                                            ("A30-24GB", "1g.6gb+me")])
def test_media_extension_profiles_need_r470(model, me):
    assert gpu_model(model).profile(me).min_driver == 470
    with pytest.raises(ValueError, match="R470"):
        geometry(model, [me], driver=460)
    assert geometry(model, [me], driver=470).profiles[0].name == me


def test_other_profile_minimum_drivers():
    assert gpu_model("A100-40GB").profile("1g.10gb").min_driver == 525
    assert gpu_model("A100-80GB").profile("1g.20gb").min_driver == 525
    assert gpu_model("A30-24GB").profile("2g.12gb+me").min_driver == 525
    with pytest.raises(ValueError, match="R525"):
        geometry("A30-24GB", ["2g.12gb+me"], driver=470)


def test_pci_ids_and_shared_profile_groups():
    from miso.mig.tables import model_for_name, model_for_pci

    # mig-parted's A100-40GB / A800-40GB filter, including the 0x20B1 miso used to lack
    for dev in (0x20B0, 0x20B1, 0x20F1, 0x20F6):
        assert model_for_pci(dev).name == "A100-40GB"
    for dev in (0x20B2, 0x20B5, 0x20F3, 0x20F5):
        assert model_for_pci(dev).name == "A100-80GB"
    for dev in (0x2342, 0x233D, 0x20B6, 0x2329):
        assert model_for_pci(dev).name == "H100-96GB"
    assert model_for_pci(0x233A).name == "H100-94GB"  # H800 NVL
    assert model_for_pci(0x3182).name == "B300-288GB"
    assert model_for_pci(0x31C2).name == "GB300-288GB"
    assert model_for_pci(0x1234) is None
    ids = [d for m in GPU_MODELS.values() for d in m.pci_device_ids]
    assert len(ids) == len(set(ids)), "a PCI id belongs to one model"
    for alias in ("A800-40GB", "A800-80GB", "H800-80GB", "H800-NVL", "H20", "GH200"):
        assert gpu_model(alias).name in GPU_MODELS
    assert model_for_name("NVIDIA RTX PRO 4500 Blackwell").name == "RTX-PRO-4500"
    assert model_for_name("NVIDIA RTX PRO 5000 Ada Generation") is None


def test_rtx_pro_6000_variants():
    m = gpu_model("RTX-PRO-6000")
    ids = {p.name: p.profile_id for p in m.profiles}
    assert ids == {"1g.24gb": 14, "1g.24gb+me": 21, "1g.24gb+gfx": 47, "1g.24gb+me.all": 65,
                   "1g.24gb-me": 67, "2g.48gb": 5, "2g.48gb+gfx": 35, "2g.48gb+me.all": 64,
                   "2g.48gb-me": 66, "4g.96gb": 0, "4g.96gb+gfx": 32}
    assert not any(p.inferred for p in m.profiles)
    # the variants share the plain rows' placements, so a gfx layout is valid
    g = geometry(m, ["1g.24gb+gfx", "2g.48gb-me"])
    assert is_valid(g, L("1g.24gb+gfx@0", "1g.24gb+gfx@3", "2g.48gb-me@6"))


def test_inferred_values_are_marked():
    assert gpu_model("H100-80GB").profile("3g.40gb").inferred == ()
    assert "placements" in gpu_model("H200-141GB").profile("3g.71gb").inferred
    gb200 = gpu_model("GB200-186GB")
    assert gb200.profile("2g.47gb").inferred == ("placements",)
    assert {"sm_count", "memory_gib"} <= set(gb200.profile("7g.186gb").inferred)
    assert "profile_id" in gpu_model("RTX-PRO-5000").profile("1g.24gb").inferred
    with pytest.raises(ValueError, match="infers unknown"):
        from miso.mig.tables import GpuModel, Profile

        GpuModel("X", "X", (), 1, 1, 1, (Profile("1g.1gb", 0, 0, 1, 1, 1.0, 1, (0,), 1,
                                                 inferred=("colour",)),))


def test_miso_gpus_lists_every_model_with_inferred_marks():
    import json

    from typer.testing import CliRunner

    from miso.cli import app

    res = CliRunner().invoke(app, ["gpus", "--json"])
    assert res.exit_code == 0
    out = {m["name"]: m for m in json.loads(res.stdout)}
    assert set(out) == set(GPU_MODELS)
    for new in ("H100-96GB", "GH200-144GB", "GB200-186GB", "B300-288GB", "GB300-288GB",
                "RTX-PRO-5000", "RTX-PRO-4500"):
        assert new in out
    b300 = {p["name"]: p for p in out["B300-288GB"]["profiles"]}
    assert "placements" in b300["3g.135gb"]["inferred"]
    assert "0x20B1" in out["A100-40GB"]["pci_device_ids"]
