"""Published runs (calibration.published) against the cost model (calibration.validate_published), and the fit
of the machine models' figures to them (calibration.fit_published).

The tolerance: after the fit, the median |error| over the published rows must stay below
MEDIAN_ERROR_LIMIT = 5%, and the median of each framework's rows below
FRAMEWORK_MEDIAN_LIMIT = 8%. Why: the joint fit (three figures per device kind, two per
framework) reaches 2.5% over all rows (leave-one-out 3.3%; FSDP rows 3.9%, leave-one-out
7.6%, on only 8 rows). The published figures themselves spread by a few percent
(llm-foundry's mpt-13b on 8 to 64 GPUs: 4767-4811 tokens/s per GPU; Megatron's table is
rounded), and most rows rest on unpublished fields (micro-batch, interleaving, global batch;
`assumed` in each record) that move a prediction by several percent, so a bound at twice the
fitted median leaves room for cost-model changes that are neutral on average while still
failing the first guesses (about 13%). Medians, not maxima: rows the cost model misses for a
structural reason (A-gpt-32b, about -20%: see the report of `exaplan validate --published`)
must not be hidden by tuning, and they show in the printed maximum instead.
"""

from __future__ import annotations

import inspect
import io
import json
import math

import numpy as np
import pytest
from rich.console import Console

import machine_models.loader as loader
from machine_models import FRAMEWORKS_FILE, DEVICE_KINDS_FILE, list_machines, load_machine
from calibration import fit_files, fit_published as cal
from calibration.published import FRAMEWORKS, UNITS, held_out_runs, published_runs
from calibration.validate_published import (
    fit_notes,
    interval_coverage,
    predict,
    published_json,
    render_published,
    shipped_machine,
    summary,
    validate_held_out,
    validate_published,
)

MEDIAN_ERROR_LIMIT = 0.05
FRAMEWORK_MEDIAN_LIMIT = 0.08


@pytest.fixture(scope="module")
def times():
    return cal.StepTimes(cal.machines_of(published_runs()))


@pytest.fixture(scope="module")
def fit(times):
    """One joint fit of every device kind and framework (about 5 s), shared below."""
    return cal.fit_published(times=times)


@pytest.fixture(scope="module")
def fitted_errors(fit, times):
    """Run -> predicted / published - 1 with the fit (full precision, not the rounded YAML)."""
    out = {}
    for r in published_runs():
        m = times.machines[r.machine]
        out[r.id] = (r, times.figure(r, fit.figures(m.device_name, r.framework)) / r.figure - 1)
    return out


def test_runs_are_well_formed():
    runs = published_runs()
    ids = [r.id for r in runs]
    assert len(ids) == len(set(ids)) == 46
    assert {r.section for r in runs} == {"A", "B", "C", "D", "H", "I", "K"}
    held = held_out_runs()
    assert {r.section for r in held} == {"A", "F", "G", "I", "J", "L", "M", "N"} and not {r.id for r in held} & set(ids)
    for r in runs:
        assert r.kind in UNITS
        assert r.layout.tp * r.layout.pp * r.layout.cp * r.layout.dp == r.gpus
        # Megatron-LM in A and B; llm-foundry (C, H) and fms-fsdp (D) train with PyTorch FSDP;
        # the LUMI (I) and Aurora (K) rows with Megatron-DeepSpeed.
        assert r.framework == ("megatron" if r.section in "AB" else "deepspeed" if r.section in "IK" else "fsdp")
        for name in r.assumed:  # every assumed field names a real field of the record
            obj = r
            for part in name.split("."):
                obj = getattr(obj, part)


def test_megatron_strong_scaling_end_points_are_held_out_and_read_what_their_note_says():
    """The README's 177B strong-scaling end points (held out) take the table's 177B row at 96 and
    4,608 GPUs. At 96 GPUs the bubble and the exposed gradient traffic are under 2% of the step,
    so that row checks the compute term alone; at 4,608 the bubble without interleaving is 5/12
    of the compute. Both are predicted with the shipped figures (their errors are reported, not
    bounded: docs/validation/limits.md)."""
    from calibration.validate_published import predict, shipped_machine

    table = next(r for r in published_runs() if r.id == "A-gpt-177b")
    strong = {r.gpus: r for r in held_out_runs() if r.id.startswith("A-gpt-177b-strong")}
    assert set(strong) == {96, 4608} and strong[96].figure > strong[4608].figure
    for gpus, run in strong.items():
        assert run.model == table.model and run.layout.global_batch == table.layout.global_batch
        assert (run.layout.tp, run.layout.pp, run.layout.dp) == (8, 6, gpus // 48)
        assert {"layout.tp", "layout.pp", "layout.vpp"} <= set(run.assumed)
    _, ev = predict(strong[96], shipped_machine(strong[96], load_machine("dgx-h100")))
    assert (ev.bubble_s[0] + ev.dp_s[0]) / ev.step_time_s[0] < 0.02
    _, ev = predict(strong[4608], shipped_machine(strong[4608], load_machine("dgx-h100")))
    assert ev.bubble_s[0] / ev.compute_s[0] == pytest.approx(5 / 12, rel=0.05)


def test_a_record_must_be_consistent_with_its_framework():
    run = next(r for r in published_runs() if r.id == "A-gpt-7.1b")
    data = run.model_dump()
    data["framework"] = "fsdp"  # FSDP does not run Megatron's distributed optimizer
    with pytest.raises(ValueError, match="does not run sharding zero1"):
        type(run).model_validate(data)


def test_every_published_run_is_predicted_and_fits_in_memory():
    rows = validate_published()
    assert len(rows) == len(published_runs())
    for row in rows:
        assert math.isfinite(row.predicted) and row.predicted > 0, row.id
        assert math.isfinite(row.error)
        assert row.loo_error is None  # leave-one-out only when asked for
        # These runs ran: the memory model must not say they do not fit.
        assert row.fits_memory, f"{row.id}: predicted not to fit in device memory"


def test_default_validation_is_cheap():
    """The CLI's default run predicts with the shipped figures (no fit, no leave-one-out)."""
    params = inspect.signature(validate_published).parameters
    assert params["refit"].default is False and params["leave_one_out_errors"].default is False


def test_unit_conversions_reproduce_the_papers_own_arithmetic():
    runs = {r.id: r for r in published_runs()}
    a100 = load_machine("dgx-a100-80gb")
    # Korthikanti et al. give both the selective-recompute iteration time and the MFU.
    for size, seconds in [("22b", 1.10), ("175b", 13.75), ("530b", 37.83), ("1t", 71.49)]:
        run = runs[f"B-gpt-{size}-selective"]
        assert run.figure_from_step_time(seconds, a100) == pytest.approx(run.figure, rel=0.01)
    # Megatron's TFLOP/s per GPU and its MFU column (41% for 408.8 on 989 TFLOP/s).
    h100 = load_machine("dgx-h100")
    run = runs["A-gpt-1.7b"]
    tokens = run.layout.global_batch * run.model.seq_len
    step = run.flops_per_token() * tokens / run.gpus / (run.figure * 1e12)
    assert run.figure_from_step_time(step, h100) == pytest.approx(run.figure)
    assert run.figure / 989.0 == pytest.approx(0.41, abs=0.005)


def test_fit_stays_within_bounds(fit):
    assert set(fit.device) == {"NVIDIA H100 SXM5", "NVIDIA A100 SXM4", "AMD MI250X GCD", "Intel Max 1550 tile"}
    assert set(fit.framework) == {r.framework for r in published_runs()}
    for figures, names in [(f, cal.DEVICE_FIGURES) for f in fit.device.values()] + \
                          [(f, cal.FRAMEWORK_FIGURES) for f in fit.framework.values()]:
        assert set(figures) == set(names)
        for name, value in figures.items():
            lo, hi = cal.BOUNDS[name]
            assert lo - 1e-9 <= value <= hi + 1e-9, (name, value)
    for kind, figures in fit.device.items():
        lo = cal.lower_bound(kind, "attention_efficiency_factor")
        assert figures["attention_efficiency_factor"] >= lo - 1e-6, kind


def test_h100_attention_is_held_at_or_above_its_published_kernel_rate(fit):
    """The H100 attention factor's floor is FlashAttention-2's published rate (0.30 of peak at
    2k tokens, head dimension 128) over a GEMM of the saturated tile's size on the first-guess
    curve; the fitted and the shipped H100 kernels run at least about that fast (the shipped
    curve differs from the first guess, hence 0.28: a figure of 0.21, as before the floor,
    fails). Kinds without a published rate keep the generic floor."""
    h100 = "NVIDIA H100 SXM5"
    floor = cal.attention_floor(h100)
    g = cal.FIRST_GUESSES[h100]
    d = cal.ATTENTION_SATURATED_DIM
    assert floor * g["peak_fraction"] * d / (d + g["half_dim"]) == pytest.approx(cal.ATTENTION_RATE_FLOOR[h100])
    assert cal.lower_bound(h100, "attention_efficiency_factor") == pytest.approx(floor) and floor > cal.BOUNDS[
        "attention_efficiency_factor"][0]
    assert cal.attention_floor("AMD MI250X GCD") is None
    assert cal.lower_bound("AMD MI250X GCD", "attention_efficiency_factor") == cal.BOUNDS["attention_efficiency_factor"][0]
    from planner.cost.compute import matmul_efficiency

    for machine in (load_machine("dgx-h100"), cal.with_figures(load_machine("dgx-h100"), fit.figures(h100, "fsdp"))):
        rate = machine.attention_efficiency_factor * float(matmul_efficiency(machine, d))
        assert rate >= 0.28, rate


def test_a100_attention_is_held_at_or_above_flashattention2s_published_rate(fit):
    """FlashAttention-2 reaches at least half of an A100's peak over its benchmarks (Dao 2023):
    the A100 factor may not fall below that rate over a GEMM of the saturated tile's size on the
    first-guess curve (about 0.78), so a fit that leaves out the one long-sequence A100 row keeps
    a FlashAttention-2-class kernel (at the old generic floor, 0.3, it could fall to 0.2 of
    peak). The fitted and the shipped A100 kernels run at least that fast."""
    a100 = "NVIDIA A100 SXM4"
    floor = cal.attention_floor(a100)
    g = cal.FIRST_GUESSES[a100]
    d = cal.ATTENTION_SATURATED_DIM
    assert floor * g["peak_fraction"] * d / (d + g["half_dim"]) == pytest.approx(0.50)
    assert 0.7 < floor < 0.85 and cal.lower_bound(a100, "attention_efficiency_factor") == pytest.approx(floor)
    assert fit.device[a100]["attention_efficiency_factor"] >= floor - 1e-9
    from planner.cost.compute import matmul_efficiency

    for machine in (load_machine("dgx-a100-80gb"), cal.with_figures(load_machine("dgx-a100-80gb"), fit.figures(a100, "fsdp"))):
        assert machine.attention_efficiency_factor * float(matmul_efficiency(machine, d)) >= 0.48


def test_figures_on_a_bound_are_named_in_the_fit_notes():
    """A figure the fit pushed onto a bound is not known, only limited: the refit says so in
    device_kinds.yaml, next to the kind's summary (floor: the kind's own, where it has one)."""
    h100, a100 = "NVIDIA H100 SXM5", "NVIDIA A100 SXM4"
    inside = {"peak_fraction": 0.7, "half_dim": 250.0, "attention_efficiency_factor": 0.8, "elementwise_efficiency": 0.4}
    fit = cal.Fit({h100: {**inside, "attention_efficiency_factor": cal.attention_floor(h100)},
                   a100: {**inside, "attention_efficiency_factor": 1.0, "elementwise_efficiency": 0.15}}, {})
    bounds = cal.at_bounds(fit)
    assert bounds[h100] == [f"attention_efficiency_factor at its floor ({cal.attention_floor(h100):.3g})"]
    assert sorted(bounds[a100]) == ["attention_efficiency_factor at its ceiling (1)", "elementwise_efficiency at its floor (0.15)"]
    # An MI250X factor of 0.5 sits above its (generic) floor, 0.3, though below H100's own: no bound.
    mi = "AMD MI250X GCD"
    assert cal.at_bounds(cal.Fit({h100: inside, mi: {**inside, "attention_efficiency_factor": 0.5}}, {})) == {}
    rows = [r for r in validate_published() if r.device in (h100, a100)]
    notes = fit_notes(rows, bounds)
    assert notes[h100][1:] == [b + "." for b in bounds[h100]] and len(notes[a100]) == 3
    assert fit_notes(rows)[h100] == notes[h100][:1]


def test_frameworks_get_their_own_figures(fit):
    """The reason for the split: Megatron hides its (ZeRO-1) data-parallel traffic almost
    fully, FSDP as llm-foundry and fms-fsdp run it much less. One figure for both would miss
    one of them. Neither pays much of a fixed cost per step: with llm-foundry's fused loss
    counted as it ran (6 bytes a logit, not 48), the 71 ms that FSDP's figure had carried went
    to 16 ms; a fixed cost of 0.1 s or more would again be standing in for per-token work."""
    meg, fsdp = fit.framework["megatron"], fit.framework["fsdp"]
    assert meg["overlap_dp"] - fsdp["overlap_dp"] > 0.3
    assert meg["overlap_dp"] > 0.8
    assert fsdp["step_overhead_s"] < 0.1 and meg["step_overhead_s"] < 0.1


def test_figures_the_rows_cannot_see_are_held_at_their_first_guess(fit, times):
    """DeepSpeed's LUMI rows (pipelined steps of 31-350 s) move by less than IDENTIFIABLE
    whatever its overlap or per-step cost: alone, they hold both at their first guesses, with
    the bounds closed on them. The Aurora rows (2 s steps) see both, so the whole set fits
    every framework figure."""
    lumi = [r for r in published_runs() if r.id.startswith("I-lumi-")]
    p = cal._Problem.of(lumi, times)
    assert set(p.held) == {("deepspeed", "overlap_dp"), ("deepspeed", "step_overhead_s")}
    for i, (g, name) in enumerate(p.params):
        closed = p.hi[i] - p.lo[i] < 1e-6
        assert closed == ((g, name) in p.held), (g, name)
        if closed:
            assert cal._from_x(name, p.lo[i]) == pytest.approx(cal.FRAMEWORK_FIRST_GUESSES[g][name], abs=1e-5)
    assert not fit.held and not cal._Problem.of(published_runs(), times).held


def test_every_fitted_kind_starts_from_fixed_first_guesses(times):
    """A kind without FIRST_GUESSES would start from (and be pulled towards) the figures the
    last refit wrote: the fit would depend on its own history."""
    kinds = {times.machines[r.machine].device_name for r in published_runs()}
    assert kinds <= set(cal.FIRST_GUESSES)


def test_fast_prediction_of_the_fit_matches_the_cost_model(fit, times):
    """The fit's memo adds step_overhead_s after the cost model (it changes no choice of
    algorithm or bucket); predicting with the whole machine must give the same figures."""
    for r in published_runs():
        m = times.machines[r.machine]
        fast = times.figure(r, fit.figures(m.device_name, r.framework))
        full, _ = predict(r, cal.machine_for(r, m, fit))
        assert fast == pytest.approx(full, rel=1e-9), r.id


def test_median_error_after_fit_is_below_limit(fitted_errors):
    errors = np.abs([e for _, e in fitted_errors.values()])
    assert np.median(errors) < MEDIAN_ERROR_LIMIT, f"median |error| {np.median(errors):.1%}"
    for fw in {r.framework for r, _ in fitted_errors.values()}:
        part = np.abs([e for r, e in fitted_errors.values() if r.framework == fw])
        assert np.median(part) < FRAMEWORK_MEDIAN_LIMIT, f"{fw}: median |error| {np.median(part):.1%}"
    first = summary(validate_published(fitted=False))[0]
    assert np.median(errors) < first, "the fit must improve on the first guesses"


def test_shipped_machine_models_carry_the_fit(fit):
    """device_kinds.yaml holds the figures of a fit of the current cost model; if this fails
    after a cost-model change, run `exaplan validate --published --refit`."""
    rows = validate_published(fitted=True)
    median, _ = summary(rows)
    assert median < MEDIAN_ERROR_LIMIT, f"median |error| {median:.1%} with the shipped figures"
    for name in ("dgx-h100", "dgx-a100-80gb"):
        m = load_machine(name)
        shipped = cal.figures_of(m)
        expected = fit.figures(m.device_name, cal.SHIPPED_FRAMEWORK)
        assert shipped["peak_fraction"] == pytest.approx(expected["peak_fraction"], abs=0.02), name
        assert shipped["half_dim"] == pytest.approx(expected["half_dim"], rel=0.1), name
        assert shipped["attention_efficiency_factor"] == pytest.approx(expected["attention_efficiency_factor"], abs=0.02)
        assert shipped["overlap_dp"] == pytest.approx(expected["overlap_dp"], abs=0.03), name
        assert shipped["step_overhead_s"] == pytest.approx(expected["step_overhead_s"], abs=0.02), name
    recorded = fit_files.framework_figures()
    assert set(fit.framework) <= set(recorded) <= set(FRAMEWORKS)
    for fw in fit.framework:
        assert recorded[fw]["overlap_dp"] == pytest.approx(fit.framework[fw]["overlap_dp"], abs=0.03), fw
        assert recorded[fw]["step_overhead_s"] == pytest.approx(fit.framework[fw]["step_overhead_s"], abs=0.02), fw


def test_every_preset_carries_the_fsdp_framework_figures():
    """The framework figures belong to exaplan's runtime (FSDP), whatever the device kind;
    machine files inherit step_overhead_s from device_kinds.yaml like the other figures."""
    fsdp = fit_files.framework_figures()[cal.SHIPPED_FRAMEWORK]
    for name in list_machines():
        if name == "local":
            continue
        m = load_machine(name)
        assert m.overlap.dp == pytest.approx(fsdp["overlap_dp"]), name
        assert m.step_overhead_s == pytest.approx(fsdp["step_overhead_s"]), name


def test_megatron_rows_are_predicted_with_megatron_figures():
    runs = {r.id: r for r in published_runs()}
    recorded = fit_files.framework_figures()
    h100 = load_machine("dgx-h100")
    meg = shipped_machine(runs["A-gpt-32b"], h100, recorded)
    assert meg.overlap.dp == pytest.approx(recorded["megatron"]["overlap_dp"])
    assert meg.step_overhead_s == pytest.approx(recorded["megatron"]["step_overhead_s"])
    assert meg.matmul_efficiency == h100.matmul_efficiency  # the device figures stay
    assert shipped_machine(runs["C-mpt-7b"], h100, recorded) is h100


def test_predictions_come_from_the_model_not_a_table():
    run = next(r for r in published_runs() if r.id == "D-llama2-7b")
    machine = load_machine(run.machine)
    base, _ = predict(run, machine)
    deeper = run.model_copy(update={"model": run.model.model_copy(update={"layers": run.model.layers * 2})})
    assert predict(deeper, machine)[0] < 0.6 * base  # twice the layers: about half the tokens/s
    wider = run.model_copy(update={"model": run.model.model_copy(update={"ffn_hidden": 2 * run.model.ffn_hidden})})
    assert predict(wider, machine)[0] < base
    faster = cal.with_figures(machine, {"peak_fraction": 0.95})
    assert predict(run, faster)[0] > base
    slower = cal.with_figures(machine, {"step_overhead_s": machine.step_overhead_s + 1.0})
    assert predict(run, slower)[0] < base


def test_section_d_runs_on_the_network_and_gradient_dtype_it_ran_with():
    """fms-fsdp's table ran on 400 Gb/s per node between nodes (the same team's PyTorch blog)
    with bf16 gradient reduction (its default policy): the preset and the record say so, and
    HSDP's replica traffic is slower there than on a DGX A100's 8 x 200 Gb/s."""
    run = next(r for r in published_runs() if r.id == "D-llama2-13b")
    machine, dgx = load_machine(run.machine), load_machine("dgx-a100-80gb")
    assert machine.nics_per_node * machine.nic_gbit_s == pytest.approx(400.0)
    assert machine.device_name == dgx.device_name and machine.devices_per_node == 8
    assert run.job().framework.grad_reduce_bytes(run.precision) == 2
    figures = {"overlap_dp": dgx.overlap.dp}
    on_ibm = predict(run, cal.with_figures(machine, figures))[1]
    on_dgx = predict(run, cal.with_figures(dgx, figures))[1]
    assert on_ibm.dp_s[0] > 1.5 * on_dgx.dp_s[0]
    assert on_ibm.compute_s[0] == pytest.approx(on_dgx.compute_s[0])


def test_leave_one_out_of_two_rows_in_two_processes_reports_each_fold():
    """Two folds in two forked workers; on_fold hears of each as it ends. Over the 14 FSDP rows
    (C, D, H: two device kinds, one framework), a fit of a few seconds, not the 46 rows' minute."""
    runs = [r for r in published_runs() if r.section in "CDH"]
    ids, seen, folds = ["D-llama2-70b", "C-mpt-30b"], [], {}
    loo = cal.leave_one_out(runs=runs, ids=ids, workers=2, on_fold=seen.append, fold_figures=folds)
    assert sorted(loo) == sorted(seen) == sorted(folds) == sorted(ids)
    assert all(math.isfinite(v) and v > 0 for v in loo.values())
    assert abs(loo["D-llama2-70b"] / 380.0 - 1) < 0.15
    assert set(folds["C-mpt-30b"]) == set(cal.DEVICE_FIGURES) | set(cal.FRAMEWORK_FIGURES)
    # the fold's figures predict its row: the same prediction from them again
    run = next(r for r in runs if r.id == "C-mpt-30b")
    times = cal.StepTimes(cal.machines_of(runs))
    assert times.figure(run, folds["C-mpt-30b"]) == pytest.approx(loo["C-mpt-30b"])


def test_a_row_that_pins_a_figure_is_named_with_the_figure():
    """moved_figures keeps the figures a fold moved by PINNED_SHIFT or more (the fixed cost per
    step by PINNED_SHIFT_S seconds); the report names the row, its kind and the move."""
    from calibration.validate_published import PINNED_SHIFT, moved_figures, pinned_lines

    full = {"elementwise_efficiency": 0.33, "peak_fraction": 0.68, "step_overhead_s": 0.0, "overlap_dp": 0.5}
    fold = {"elementwise_efficiency": 0.20, "peak_fraction": 0.68 * (1 + PINNED_SHIFT / 2), "step_overhead_s": 0.03,
            "overlap_dp": 0.5}
    assert moved_figures(full, fold) == {"elementwise_efficiency": (0.33, 0.20), "step_overhead_s": (0.0, 0.03)}
    rows = validate_published()
    assert pinned_lines(rows) == []  # no leave-one-out: nothing to say
    rows[0].loo_error, rows[0].loo_moved = -0.184, {"elementwise_efficiency": (0.33, 0.20)}
    lines = pinned_lines(rows)
    assert len(lines) == 2 and rows[0].id in lines[1] and "-18.4%" in lines[1] and "0.33 -> 0.2" in lines[1]


def test_write_fit_keeps_comments_and_is_read_back(tmp_path, monkeypatch, fit):
    path, profiles = tmp_path / "device_kinds.yaml", tmp_path / "frameworks.yaml"
    original = DEVICE_KINDS_FILE.read_text()
    path.write_text(original)
    profiles.write_text(FRAMEWORKS_FILE.read_text())
    notes = {"": ["all rows: a note"], "NVIDIA H100 SXM5": ["an H100 note."]}
    fit_files.write_fit(fit, notes, path, date="2000-01-01", frameworks=profiles)
    once, profiles_once = path.read_text(), profiles.read_text()
    fit_files.write_fit(fit, notes, path, date="2000-01-01", frameworks=profiles)
    assert path.read_text() == once and profiles.read_text() == profiles_once, "rewriting is idempotent"
    kept = [ln for ln in FRAMEWORKS_FILE.read_text().splitlines() if ln.lstrip().startswith("#") and "# fit:" not in ln]
    assert all(ln in profiles_once for ln in kept)
    # Every comment line of the original that the refit does not own is still there.
    kept = [ln for ln in original.splitlines() if ln.lstrip().startswith("#") and "# fit:" not in ln]
    assert all(ln in once for ln in kept)
    assert "2000-01-01" in once and "an H100 note." in once
    recorded = fit_files.framework_figures(path, profiles)
    for fw in fit.framework:
        for name in cal.FRAMEWORK_FIGURES:
            assert recorded[fw][name] == pytest.approx(fit.framework[fw][name], abs=1e-3)
    measured = load_machine("dgx-h100").runtime_kernels  # nested figures the refit must not touch
    monkeypatch.setattr(loader, "DEVICE_KINDS_FILE", path)
    assert measured is not None and load_machine("dgx-h100").runtime_kernels == measured
    fsdp = fit.framework[cal.SHIPPED_FRAMEWORK]
    for name in ("dgx-h100", "dgx-a100-80gb", "frontier"):
        m = load_machine(name)
        if m.device_name in fit.device:
            figs = fit.device[m.device_name]
            assert m.matmul_efficiency.peak_fraction == pytest.approx(figs["peak_fraction"], abs=1e-3)
            assert m.matmul_efficiency.half_dim == pytest.approx(figs["half_dim"], abs=0.1)
            assert m.attention_efficiency_factor == pytest.approx(figs["attention_efficiency_factor"], abs=1e-3)
        assert m.overlap.dp == pytest.approx(fsdp["overlap_dp"], abs=1e-3)
        assert m.step_overhead_s == pytest.approx(fsdp["step_overhead_s"], abs=1e-3)
    gh200 = loader._device_kinds()["NVIDIA GH200"]
    assert gh200["matmul_efficiency"]["peak_fraction"] == pytest.approx(fit.device["NVIDIA H100 SXM5"]["peak_fraction"], abs=1e-3)


def test_render_and_json():
    rows = validate_published()
    rows[0].loo_predicted, rows[0].loo_error = rows[0].predicted, 0.0  # as if computed
    out = io.StringIO()
    render_published(rows, Console(file=out, width=240, color_system=None))
    text = out.getvalue()
    assert "median |error|" in text and "leave-one-out" in text
    assert all(r.id in text for r in rows)
    assert "megatron:" in text and "fsdp:" in text and "NVIDIA A100 SXM4:" in text
    data = json.loads(json.dumps(published_json(rows)))
    assert data["summary"]["rows"] == len(rows)
    assert data["summary"]["median_abs_error"] == pytest.approx(summary(rows)[0])
    assert data["rows"][0]["id"] == rows[0].id and data["rows"][0]["framework"] == "megatron"
    assert set(data["by_framework"]) == {r.framework for r in rows}
    assert sum(part["rows"] for part in data["by_device"].values()) == len(rows)


def test_every_row_carries_the_interval_a_plan_would_show():
    """Each row's interval is its prediction widened by the uncertainty of its device kind and
    framework (a rate inversely to a time), and `inside_interval` says whether the published
    figure lies in it."""
    from machine_models.uncertainty import uncertainty_of

    rows = validate_published() + validate_held_out()
    runs = {r.id: r for r in published_runs() + held_out_runs()}
    for row in rows:
        lo, hi = row.interval
        assert lo < row.predicted < hi, row.id
        assert row.inside_interval == (lo <= row.published <= hi), row.id
    for kind in ("iteration_time_s", "tokens_per_s_per_gpu"):
        row = next(r for r in rows if r.kind == kind)
        run = runs[row.id]
        u = uncertainty_of(shipped_machine(run, load_machine(run.machine)), run.job().framework)
        expected = u.time_interval(row.predicted) if kind == "iteration_time_s" else u.rate_interval(row.predicted)
        assert row.interval == pytest.approx(expected)
    data = json.loads(json.dumps(published_json(rows)))
    assert data["summary"]["inside_interval"] == pytest.approx(np.mean([r.inside_interval for r in rows]))


def test_held_out_rows_fall_inside_their_intervals_as_often_as_promised():
    """The intervals are the 80% conformal bound of leave-one-out errors; on the published rows
    no fit saw, about 80% should fall inside (81% and 83% when this test was written, 74% under
    the contention form's narrower bands with np.quantile, 80% with the conformal bound). 70% is
    four binomial standard deviations below 80% at this count: less would mean intervals that
    promise more than the model holds where it was not fitted."""
    rows = validate_held_out()
    assert len(rows) > 200
    assert interval_coverage(rows) >= 0.70


def test_llm_foundry_rows_replay_as_their_campaign_did():
    """The fitted llm-foundry rows (C, H) stop the recompute's replay early (torch 2.1+) except
    the two A100 70b rows, which share the May 2023 campaign's bf16 PURE settings (torch 1.13:
    a whole replay; calibration/published_foundry.py)."""
    rows = [r for r in published_runs() if r.section in "CH"]
    whole = {r.id for r in rows if not r.job().framework.recompute_early_stop}
    assert whole == {"H-mpt-70b-s2048-g64", "H-mpt-70b-s2048-g32"}
    assert all(r.grad_reduce_bf16 for r in rows if r.id in whole)
