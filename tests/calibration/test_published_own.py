"""Section M (calibration/published_own.py): exaplan's own runs on lent GPUs (an H200, an H100),
held out. The records must say what the evidence files (docs/gpu/) measured and what the plan
ran, and each prediction must fall inside the uncertainty the planner states for its device
kind: the eager rows through the exaplan profile's eager term, the compiled ones without it,
all at the kinds' measured kernels (planner/schema/kernels.py). Six were predicted before they
ran (docs/gpu/2026-11-26-h{100,200}-heldout-predictions.json); the eager surplus's measured rate
was set after them, and two more checked it blind (docs/gpu/2026-11-26-h100-heldout2-*; README
"Measured kernels")"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from calibration.published import held_out_runs, published_runs
from calibration.published_own import CASES, evidence_file, own_gpu_runs
from calibration.validate_published import predict
from machine_models.loader import load_machine

ROOT = Path(__file__).resolve().parents[2]


CASES_RUN = ("h200", "h100", "h100-s2048", "h100-s4096", "h100-s8192", "h100-h1024", "h200-s8192", "h100-h1536",
             "h100-full", "h100-s4096-full", "h100-s8192-sel", "h100-s2048-full", "h100-op", "h100-s4096-op",
             "h100-s8192-op", "h100-s2048-op", "h100-s4096-full4")
# (case, mode) of every run with an evidence file: both modes of CASES_RUN (the 1.2B full-
# recompute run with accumulation measured compiled in a later call: its first compiled run
# finished without its file, the lent machine's time ran out).
# The JAX backend's runs (mode "jax"), 2026-11-27: three measured first, two predicted before
# they ran (docs/gpu/2026-11-27-h100-jax-blind-predictions.json); then four with recompute, each
# predicted before it ran (2026-11-27-h100-jax-{full,recompute,search}-predictions.json), the
# full-recompute one before XLA's early stop was known (-10.4% with a whole replay, -6.2% after).
JAX_RUN = ("h100-jax", "h100-jax-mbs8", "h100-s4096-jax", "h100-s8192-jax", "h100-h1024-jax",
           "h100-s2048-full-jax", "h100-s2048-op-jax", "h100-s8192-sel-jax", "h100-sel-jax")
JAX_BLIND = ("h100-s8192-jax", "h100-h1024-jax")
JAX_RECOMPUTE_BLIND = {"h100-s2048-op-jax": "recompute", "h100-s8192-sel-jax": "recompute", "h100-sel-jax": "search"}
RUN_PAIRS = {(c, m) for c in CASES_RUN for m in ("compile", "eager")} | {(c, "jax") for c in JAX_RUN}
# Every run lies inside its stated band, and, whatever that band, within WITHIN of its
# prediction: the largest are 7.8-7.9% (two eager runs with recompute at 4k tokens, the JAX
# search's pick). The contention form's refit of 2026-11-27 narrowed H100's percentile band to
# 7.5% and three eager recompute runs, 7.5-7.9% slow, lay just outside it (then held within 8.5%);
# the conformal bound of the seventeenth session widened the band to 11.5%, so WITHIN holds every
# run, the JAX ones (+/-30% stated) included, to 8.5%.
WITHIN = 0.085
PROTEIN_35B = ("h200", "h100", "h100-s2048")


def _card_mode(run):
    rest, mode = run.id.rsplit("-", 1)
    case = next(c for c in CASES if rest == f"M-{CASES[c][5]}-{c}")
    return case, mode


def _plan(case: str) -> dict:
    return yaml.safe_load((ROOT / "plans" / "gpu" / f"{CASES[case][5]}_1x{CASES[case][1]}.yaml").read_text())


def test_the_records_are_the_measured_runs():
    runs = {_card_mode(r): r for r in own_gpu_runs()}
    assert set(runs) == RUN_PAIRS
    for (case, mode), run in runs.items():
        plan = _plan(case)
        tokens = plan["job"]["global_batch"] * plan["job"]["seq_len"]
        assert run.model.seq_len == plan["job"]["seq_len"] and run.layout.global_batch == plan["job"]["global_batch"]
        measured = json.loads((ROOT / "docs" / "gpu" / evidence_file(case, mode)).read_text())
        key = f"{CASES[case][5]}_1x{CASES[case][1]}" + ("+compile" if mode == "compile" else "")
        assert measured["config"].get("compile", False) == (mode == "compile")  # the first H200 run predates the key
        median = measured["plans"][key]["best"]["exaplan"]["median_s"]
        assert run.figure == pytest.approx(tokens / median, rel=1e-3)
        assert run.layout.micro_batch == plan["micro_batch_size"] and run.layout.dp == 1
        assert run.layout.gas == plan["grad_accumulation_steps"] and run.layout.recompute.value == plan["recompute"]
        for field in ("name", "hidden", "layers", "heads", "kv_heads", "ffn_hidden"):
            assert getattr(run.model, field) == plan["model"][field], (run.id, field)
        assert run.torch_blocks == {"compile": "compiled", "eager": "eager", "jax": None}[mode]
        assert run.jax_backend == (mode == "jax") == (plan.get("backend", "torch") == "jax") and run.profile == plan["job"]["framework"]["name"]


def test_held_out_and_predicted_within_the_stated_uncertainty():
    assert not {r.id for r in own_gpu_runs()} & {r.id for r in published_runs()}
    assert {r.id for r in own_gpu_runs()} <= {r.id for r in held_out_runs()}
    predicted = {}
    for run in own_gpu_runs():
        card, mode = _card_mode(run)
        plan = _plan(card)
        unc = plan["prediction"]["uncertainty"]
        # The H100 kind is fitted (its leave-one-out band), the H200 copies it (+/-30%), the jax
        # profile has no band of its own (+/-30%).
        assert unc["fitted"] == (card.startswith("h100") and mode != "jax")
        assert not plan["compile"]  # the plans are eager, as `exaplan run` runs them by default
        predicted[card, mode], _ = predict(run, load_machine(run.machine))
        if mode in ("eager", "jax"):  # the plan's own prediction
            assert predicted[card, mode] == pytest.approx(plan["prediction"]["tokens_per_s"], rel=1e-6)
        assert abs(predicted[card, mode] / run.figure - 1) < min(unc["step_time"], WITHIN), run.id
    for card in PROTEIN_35B:  # compiling removes the eager term: 20-30% faster on protein-3.5b's plans
        assert 1.15 < predicted[card, "compile"] / predicted[card, "eager"] < 1.4


def test_the_measured_kernels_carry_the_long_and_narrow_compiled_cases():
    """Without the H100's measured kernels (the fitted figures alone, as before they were
    measured) the compiled runs at 4k-8k tokens and the narrow block are 20-30% off; with them,
    within 5% (the fitted figures are other frameworks' effective rates)."""
    from planner.cost import compute

    runs = {_card_mode(r): r for r in own_gpu_runs()}
    for case in ("h100-s4096", "h100-s8192", "h100-h1024"):
        run = runs[case, "compile"]
        machine = load_machine(run.machine)
        assert machine.runtime_kernels is not None and run.job().framework.measured_kernels
        with_kernels, _ = predict(run, machine)
        assert abs(with_kernels / run.figure - 1) < 0.05, case
        fitted, _ = predict(run, machine.model_copy(update={"runtime_kernels": None}))
        assert abs(fitted / run.figure - 1) > 0.2, case
    assert compute.measured_kernels(machine, runs["h100", "compile"].job().model_copy(
        update={"framework": runs["h100", "compile"].job().framework.model_copy(update={"measured_kernels": False})})) is None


def test_the_jax_backend_within_8_percent_and_blind_within_2():
    """The JAX backend on the H100 (jax profile: the kind's measured kernels, 16 bytes per
    parameter per micro-batch counted). Predicted before they ran, by the committed predictions
    (docs/gpu/2026-11-27-h100-jax-*-predictions.json against the measured medians): two runs
    without recompute within 2%, then selective-op -3.9%, selective +0.9% and the search's pick
    (selective at micro-batch 32) -7.2% in step time. Now: those two still within 2% and every
    JAX run within 8% (the three measured first were within 6% until the contention form's refit
    of 2026-11-27 gave the device kind a fixed cost of 13 ms a step: -6.3% at most), and the
    current model within 2% of each committed prediction."""
    stated = {}
    for part in ("blind", "recompute", "search"):
        file = ROOT / "docs" / "gpu" / f"2026-11-27-h100-jax-{part}-predictions.json"
        stated.update({name: p["step_time_s"] for name, p in json.loads(file.read_text())["plans"].items()})
    measured = json.loads((ROOT / "docs" / "gpu" / "2026-11-27-h100-jax-blind.json").read_text())["plans"]
    for name in ("protein-1.2b-h2048_1xh100_s8192_jax", "protein-0.3b-h1024_1xh100_s2048_jax"):
        assert abs(measured[name]["best"]["exaplan"]["median_s"] / stated[name] - 1) < 0.02, name
    seen = 0
    for run in own_gpu_runs():
        case, mode = _card_mode(run)
        if mode != "jax":
            continue
        predicted, ev = predict(run, load_machine(run.machine))
        assert abs(predicted / run.figure - 1) < (0.02 if case in JAX_BLIND else 0.08), run.id
        name = f"{CASES[case][5]}_1x{CASES[case][1]}"
        if case in JAX_BLIND or case in JAX_RECOMPUTE_BLIND:
            seen += 1
            assert float(ev.step_time_s[0]) == pytest.approx(stated[name], rel=0.02), run.id
            measured = json.loads((ROOT / "docs" / "gpu" / evidence_file(case, mode)).read_text())["plans"]
            assert abs(measured[name]["best"]["exaplan"]["median_s"] / stated[name] - 1) < 0.08, run.id
    assert seen == len(JAX_BLIND) + len(JAX_RECOMPUTE_BLIND)
