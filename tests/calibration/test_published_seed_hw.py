"""The published rows on the seed systems' device kinds (sections I-K, calibration/data/published/):
each record consistent in itself, on a preset of the device kind it ran on, held out (never
fitted), and predicted by the cost model as `exaplan validate --published` predicts held-out rows."""

from __future__ import annotations

import math

import pytest

from calibration.published import PublishedLayout, PublishedRun, held_out_runs, published_runs, section_runs
from calibration.validate_published import validate_held_out, validate_published
from machine_models import list_machines, load_machine
from planner.cost.flops import total_params

RUNS = [r for s in "IJK" for r in section_runs(s)]
# Published parameter counts (billions) for the rows whose source prints one, by model name.
PRINTED_PARAMS_B = {"llama3-l4": 1.98, "llama3-l8": 2.38, "llama3-l12": 2.78, "llama3-l14": 2.98,
                    "smollm3-l8": 1.67, "smollm3-l18": 2.45}
# The device kind each section ran on (machine preset device_name).
SECTION_DEVICE = {"I": "AMD MI250X GCD", "J": "NVIDIA GH200", "K": "Intel Max 1550 tile"}
IDS = [r.id for r in RUNS]

# Parameter counts the logs print for models without an entry in PRINTED_PARAMS_B.
LOGGED_PARAMS = {
    "bloom-176b": 173_427_208_192,  # lumi-llm-scaling 175B logs: DeepSpeed UNIQUE_PARAMS (vocab 51200)
}


def test_rows_validate_with_unique_ids():
    assert len(RUNS) >= 3
    assert len(set(IDS)) == len(IDS)
    assert {r.section for r in RUNS} == set(SECTION_DEVICE)


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_record_is_consistent(run: PublishedRun):
    lay = run.layout
    assert run.id.startswith(run.section + "-")
    assert lay.tp * lay.pp * lay.dp == run.gpus
    assert lay.global_batch % (lay.dp * lay.micro_batch) == 0
    assert run.source.strip() and run.note.strip()
    assert run.figure > 0
    if run.kind in ("model_tflops_per_gpu", "mfu"):
        assert run.flop_convention != "none"


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_machine_preset_is_the_device_kind_the_row_ran_on(run: PublishedRun):
    assert run.machine in list_machines()
    assert load_machine(run.machine).device_name == SECTION_DEVICE[run.section]


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_assumed_fields_are_real_and_documented(run: PublishedRun):
    for name in run.assumed:
        head, _, rest = name.partition(".")
        assert head in PublishedRun.model_fields, name
        if head == "layout":
            assert rest in PublishedLayout.model_fields, name
        elif head == "model":
            assert rest in type(run.model).model_fields, name
        else:
            assert not rest, name
    # A stand-in preset is always declared, and the note says what differs.
    if "machine" in run.assumed:
        assert "stand" in run.note


@pytest.mark.parametrize("run", [r for r in RUNS if r.model.name in PRINTED_PARAMS_B or r.model.name in LOGGED_PARAMS],
                         ids=lambda r: r.id)
def test_model_shape_matches_the_printed_parameter_count(run: PublishedRun):
    expected = LOGGED_PARAMS.get(run.model.name) or PRINTED_PARAMS_B[run.model.name] * 1e9
    assert total_params(run.model) == pytest.approx(expected, rel=0.01)


def test_lumi_and_aurora_rows_are_fitted_the_rest_held_out():
    """Section I's LUMI rows (Frontier's node, the seed paper's framework) and the Max 1550
    rows (K: Aurora, the same framework) are fitted; the Frontier torchtitan row and GH200 (J)
    only predicted."""
    held = {r.id for r in held_out_runs()}
    fitted = {r.id for r in published_runs()}
    chosen = {i for i in IDS if i.startswith(("I-lumi-", "K-"))}
    assert len(chosen) == 15 and chosen <= fitted and not chosen & held
    assert set(IDS) - chosen <= held and not (set(IDS) - chosen) & fitted


def test_every_row_is_predicted():
    rows = {r.id: r for r in validate_held_out() + validate_published()}
    for rid in IDS:
        row = rows[rid]
        assert math.isfinite(row.predicted) and row.predicted > 0, rid
        assert math.isfinite(row.error), rid
        # These runs ran: the memory model must not say they do not fit.
        assert row.fits_memory, f"{rid}: predicted not to fit in device memory"


def test_lumi_rows_reduce_bf16_gradients_over_lumis_measured_nics():
    """The LUMI logs' comms lines move 2 bytes per parameter of rank 0's stage in its gradient
    allreduce (DeepSpeed casts its BF16_Optimizer's fp32 gradients to communication_data_type,
    the model's bf16 when unset): the rows reduce bf16 as the DeepSpeed profile does, on the
    `lumi` preset whose NICs run at the efficiency those lines measured. Recorded in fp32 the
    data-parallel traffic would cost more; a record cannot reduce in both dtypes."""
    from calibration.validate_published import predict

    lumi = [r for r in RUNS if r.id.startswith("I-lumi")]
    assert len(lumi) == 8
    assert all(not r.grad_reduce_fp32 and r.job().framework.grad_reduce_dtype == "bf16" for r in lumi)
    assert all(r.machine == "lumi" and "machine" not in r.assumed for r in lumi)
    assert load_machine("lumi").inter_node_efficiency == pytest.approx(0.39)
    big = next(r for r in lumi if r.id.endswith("n256"))
    machine = load_machine(big.machine)
    _, ev16 = predict(big, machine)
    _, ev32 = predict(big.model_copy(update={"grad_reduce_fp32": True}), machine)
    assert float(ev32.dp_s[0]) > 1.3 * float(ev16.dp_s[0])
    with pytest.raises(ValueError, match="not both"):
        PublishedRun.model_validate({**big.model_dump(), "grad_reduce_fp32": True, "grad_reduce_bf16": True})
