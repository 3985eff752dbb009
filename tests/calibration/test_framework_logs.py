"""A framework's training log read back against its plan (calibration/framework_logs.py,
`exaplan calibrate --from-log`): each parser on its committed real sample (the expected
figures taken from the sample text by plain string splitting, not the parser's regexes), the
command end to end against plans made here with `exaplan estimate`, its refusals, and a
recorded run that `exaplan calibrate --from-runs` refits from."""

from __future__ import annotations

import datetime as dt
import json
import statistics
from pathlib import Path

import pytest

from calibration.framework_logs import FORMATS, compare, detect_format, read_log
from cli.main import main
from planner.schema.errors import PlanError
from planner.schema.plan import load_plan

LOGS = Path(__file__).resolve().parents[2] / "calibration" / "data" / "logs"
MEGATRON = LOGS / "megatron-lm_issue756-mixtral-16xh100.log"
LUMI = LOGS / "megatron-deepspeed_lumi-bloom176b-n16.log"
ALCF = LOGS / "megatron-deepspeed_alcf-polaris.log"
TITAN = LOGS / "torchtitan_pr3393-debugmodel-2gpu.log"
DEEPSPEED = LOGS / "deepspeed_issue1825-bert-notebook.log"
SAMPLES = {MEGATRON: "megatron", LUMI: "megatron-deepspeed", ALCF: "megatron-deepspeed", TITAN: "torchtitan",
           DEEPSPEED: "deepspeed"}

BLOOM = """name: bloom-176b
layers: 70
hidden: 14336
heads: 112
kv_heads: 112
ffn_hidden: 57344
vocab_size: 51200
seq_len: 2048
activation: gelu
norm: layernorm
tied_embeddings: true
"""


def body(path: Path) -> list[str]:
    """The sample's log lines (its header comments left out)."""
    return [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]


def after(line: str, label: str) -> str:
    """The first word after `label` in `line`, without a trailing separator."""
    return line.split(label, 1)[1].split()[0].rstrip(",|")


def number(s: str) -> float:
    return float(s.replace(",", ""))


def estimate(tmp: Path, name: str, *argv: str) -> Path:
    out = tmp / f"{name}.yaml"
    assert main(["estimate", *argv, "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plans of the samples' runs, made as a user would with `exaplan estimate`: the same batch,
    sequence, world size and degrees as the log states (the model too where it states it)."""
    tmp = tmp_path_factory.mktemp("plans")
    (tmp / "bloom.yaml").write_text(BLOOM)
    bloom = ["--model", str(tmp / "bloom.yaml"), "--machine", "lumi", "--nodes", "16", "--tp", "8", "--pp", "8",
             "--dp", "2", "--mbs", "2", "--seq-len", "2048", "--precision", "bf16", "--recompute", "full",
             "--shard", "zero1", "--schedule", "1f1b"]
    alcf = ["--model", "protein-7b", "--machine", "dgx-a100-40gb", "--nodes", "24", "--framework", "deepspeed",
            "--tp", "2", "--dp", "96", "--shard", "zero2", "--mbs", "8", "--global-batch", "768", "--precision", "fp16",
            "--recompute", "full"]
    return {
        # the deepspeed profile splits layers evenly (70 over 8 stages is refused): the exaplan profile's plan
        "lumi": estimate(tmp, "lumi", *bloom, "--global-batch", "1024"),
        "lumi-batch512": estimate(tmp, "lumi-batch512", *bloom, "--global-batch", "512"),
        "alcf": estimate(tmp, "alcf", *alcf, "--seq-len", "4096"),
        "alcf-seq2048": estimate(tmp, "alcf-seq2048", *alcf, "--seq-len", "2048"),
        "titan": estimate(tmp, "titan", "--model", "protein-tiny", "--machine", "dgx-h100", "--set",
                          "machine.devices_per_node=2", "--nodes", "1", "--framework", "torchtitan", "--dp", "2", "--shard", "fsdp",
                          "--mbs", "4", "--global-batch", "8", "--seq-len", "2048"),
        "titan-dp4": estimate(tmp, "titan-dp4", "--model", "protein-tiny", "--machine", "dgx-h100", "--set",
                              "machine.devices_per_node=4", "--nodes", "1", "--framework", "torchtitan", "--dp", "4", "--shard", "fsdp",
                              "--mbs", "2", "--global-batch", "8", "--seq-len", "2048"),
        "megatron": estimate(tmp, "megatron", "--model", "protein-7b", "--machine", "dgx-h100", "--nodes", "2",
                             "--framework", "megatron", "--dp", "16", "--mbs", "1", "--global-batch", "128", "--seq-len",
                             "4096", "--shard", "zero1"),
    }


# ------------------------------------------------------------------------------------------ the samples


@pytest.mark.parametrize("path", list(SAMPLES), ids=lambda p: p.stem)
def test_every_sample_names_its_source_and_licence_and_is_detected(path):
    header = [ln for ln in path.read_text().splitlines() if ln.startswith("#")]
    text = " ".join(header).lower()
    assert "https://github.com/" in text and "licen" in text and "verbatim" in text
    assert detect_format(body(path)) == SAMPLES[path] and read_log(path).format == SAMPLES[path]
    assert set(SAMPLES.values()) == set(FORMATS)


def test_megatron_lm_lines_read_as_written():
    lines = [ln for ln in body(MEGATRON) if "elapsed time per iteration (ms):" in ln]
    log = read_log(MEGATRON)
    assert len(log.steps) == len(lines) == 8 and log.repeated_lines == 0
    assert [s.step for s in log.steps] == [int(ln.split("iteration", 1)[1].split("/")[0]) for ln in lines]
    assert [s.step_time_s for s in log.steps] == pytest.approx(
        [number(after(ln, "elapsed time per iteration (ms):")) / 1e3 for ln in lines])
    assert [s.tflops_per_device for s in log.steps] == [number(after(ln, "(TFLOP/s/GPU):")) for ln in lines]
    assert {s.global_batch for s in log.steps} == {int(after(ln, "global batch size:")) for ln in lines} == {128}
    memory = [number(after(ln, "max allocated:")) for ln in body(MEGATRON) if "max allocated:" in ln]
    assert log.memory_gib == pytest.approx(max(memory) / 1024) and "max_memory_allocated" in log.memory_measure
    assert log.stated == {}  # the excerpt has no arguments block


def test_megatron_deepspeed_lumi_lines_and_arguments_read_as_written():
    text = body(LUMI)
    lines = [ln for ln in text if "elapsed time per iteration (s):" in ln]
    log = read_log(LUMI)
    assert [s.step for s in log.steps] == [1, 2, 3, 4] and len(lines) == 4
    assert [s.step_time_s for s in log.steps] == [number(after(ln, "iteration (s):")) for ln in lines]
    assert [s.samples_per_s for s in log.steps] == [number(after(ln, "samples per second:")) for ln in lines]
    assert [s.tflops_per_device for s in log.steps] == [number(after(ln, "TFLOPs:")) for ln in lines]
    # the arguments block: `  0:   name ..... value`
    args = {ln.split()[1]: ln.split()[-1] for ln in text if " ..." in ln and "[config.py" not in ln}
    for name, key in (("global_batch_size", "global_batch"), ("micro_batch_size", "micro_batch"),
                      ("seq_length", "seq_len"), ("num_layers", "layers"), ("hidden_size", "hidden"),
                      ("num_attention_heads", "heads"), ("ffn_hidden_size", "ffn_hidden"),
                      ("tensor_model_parallel_size", "tp"), ("pipeline_model_parallel_size", "pp")):
        assert log.stated[key][0] == int(args[name]), name
    world_line = next(ln for ln in text if "using world size:" in ln)
    assert log.stated["world_size"][0] == int(after(world_line, "using world size:")) == 128
    assert log.stated["dp"][0] == int(after(world_line, "data-parallel-size:")) == 2
    assert log.stated["grad_accumulation"][0] == int(next(ln for ln in text if "gradient_accumulation_steps" in ln).split()[-1])
    memory = [number(after(ln, "max allocated:")) for ln in text if "max allocated:" in ln]
    assert len(memory) == 64 and log.memory_gib == pytest.approx(max(memory) / 1024)


def test_alcf_lines_as_megatron_deepspeed_and_as_deepspeed():
    text = body(ALCF)
    iters = [ln for ln in text if "elapsed time per iteration (ms):" in ln]
    log = read_log(ALCF)
    assert [s.step_time_s for s in log.steps] == pytest.approx([number(after(ln, "(ms):")) / 1e3 for ln in iters])
    assert [s.seq_len for s in log.steps] == [int(after(ln, "actual seqlen:")) for ln in iters] == [4096, 4096]
    assert [s.tokens_per_s_per_device for s in log.steps] == [number(after(ln, "(tgs):")) for ln in iters]
    # DeepSpeed's own engine lines of the same log: the throughput timer's current samples/s
    timer = [ln for ln in text if "CurrSamplesPerSec=" in ln]
    ds = read_log(ALCF, "deepspeed")
    assert [s.step for s in ds.steps] == [int(after(ln, "global_step=")) for ln in timer] == [199, 200]
    assert [s.samples_per_s for s in ds.steps] == [number(after(ln, "CurrSamplesPerSec=")) for ln in timer]
    assert ds.memory_gib == max(number(after(ln, "MaxMemAllocated=").removesuffix("GB")) for ln in timer)


def test_torchtitan_lines_read_as_written():
    text = body(TITAN)
    lines = [ln for ln in text if " step:" in ln]
    log = read_log(TITAN)
    assert [s.step for s in log.steps] == [int(after(ln, "step:")) for ln in lines] == list(range(14, 22))
    assert [s.tokens_per_s_per_device for s in log.steps] == [number(after(ln, "tps:")) for ln in lines]
    assert [s.tflops_per_device for s in log.steps] == [number(after(ln, "tflops:")) for ln in lines]
    assert [s.mfu for s in log.steps] == pytest.approx([number(after(ln, "mfu:").rstrip("%")) / 100 for ln in lines])
    assert log.memory_gib == max(number(after(ln, "memory:").split("GiB")[0]) for ln in lines)
    mesh = next(ln for ln in text if "device mesh" in ln).split("parallelism:")[1]
    degrees = {k.strip(): int(v) for k, v in (kv.split("=") for kv in mesh.split(","))}
    assert {k: log.stated[k][0] for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")} == {
        k: degrees[k] for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")}
    assert log.stated["world_size"][0] == 2


def test_torchtitan_step_time_from_tps_matches_the_logs_own_clock(plans):
    """torchtitan logs tokens/s per device, not a step time: step time = the plan's tokens per
    step / (tps x world size). At log frequency 1 the lines' timestamps are one step apart: the
    derived step times agree with them (a plan of 8 x 2048 tokens on 2 ranks, torchtitan's
    debugmodel default of 8,192 tokens per rank)."""
    stamps = [dt.datetime.strptime(ln.split("[titan] ")[1][:23], "%Y-%m-%d %H:%M:%S,%f")
              for ln in body(TITAN) if " step:" in ln]
    clock = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
    result = compare(read_log(TITAN), load_plan(plans["titan"]), warmup=1)
    assert result["rows"][0]["median"] == pytest.approx(statistics.median(clock), rel=0.02)


def test_deepspeed_step_time_from_its_step_reports():
    """Older DeepSpeed prints a running average of samples/s; the step time is the time between
    its step reports over the steps between them."""
    text = body(DEEPSPEED)
    reports = [(int(after(ln, "step=")), dt.datetime.fromisoformat(ln[1:24].replace(",", ".")))
               for ln in text if "[Rank 0] step=" in ln]
    expected = [(t1 - t0).total_seconds() / (s1 - s0) for (s0, t0), (s1, t1) in zip(reports, reports[1:])]
    log = read_log(DEEPSPEED)
    assert len(reports) == 3 and [s.step for s in log.steps] == [r[0] for r in reports[1:]]
    assert [s.step_time_s for s in log.steps] == pytest.approx(expected)
    assert log.memory_gib == max(number(after(ln, "MaxMemAllocated=").removesuffix("GB")) for ln in text
                                 if "MaxMemAllocated=" in ln)


def test_other_ranks_copies_of_a_line_and_colours(tmp_path):
    """Constructed here (not a sample): the torchtitan sample's step lines printed twice, as
    every rank does without a rank filter, and coloured as torchtitan's logger colours them."""
    lines = [ln for ln in body(TITAN) if " step:" in ln]
    coloured = ["\x1b[31m" + ln.replace("  loss:", "  \x1b[32mloss:") + "\x1b[39m" for ln in lines]
    f = tmp_path / "ranks.log"
    f.write_text("\n".join(x for pair in zip(coloured, lines) for x in pair) + "\n")
    log = read_log(f)
    assert log.format == "torchtitan" and len(log.steps) == len(lines) and log.repeated_lines == len(lines)
    assert [s.tokens_per_s_per_device for s in log.steps] == [s.tokens_per_s_per_device for s in read_log(TITAN).steps]


# ------------------------------------------------------------------------------------- the command


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["calibrate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_lumi_log_against_its_plan_json(plans, capsys):
    code, out, _ = run(capsys, "--from-log", str(LUMI), "--plan", str(plans["lumi"]), "--warmup", "1", "--json")
    assert code == 0
    result = json.loads(out)
    plan = load_plan(plans["lumi"])
    times = [number(after(ln, "iteration (s):")) for ln in body(LUMI) if "iteration (s):" in ln][1:]
    rows = {r["what"]: r for r in result["rows"]}
    step = rows["step time"]
    assert step["median"] == pytest.approx(statistics.median(times)) and result["steps_measured"] == 3
    assert step["predicted"] == plan.prediction.step_time_s
    assert step["interval"] == pytest.approx(list(plan.prediction.uncertainty.time_interval(plan.prediction.step_time_s)))
    assert step["inside"] == (step["interval"][0] <= step["median"] <= step["interval"][1])
    assert rows["tokens/s"]["median"] == pytest.approx(1024 * 2048 / statistics.median(times))
    assert rows["peak memory per device"]["predicted"] == plan.prediction.memory_gib_per_device
    checked = {c["plan_field"]: c["log"] for c in result["checked"]}
    assert checked["job.global_batch"] == 1024 and checked["job.seq_len"] == 2048 and checked["nodes"] == 128
    assert checked["mesh.tp"] == 8 and checked["model.layers"] == 70
    assert any("'exaplan' framework profile" in n for n in result["notes"])
    # its comms-logger line is calibration/comms_log.py's: the note points there
    comms = sum("comm op:" in ln for ln in body(LUMI))
    assert comms == 1 and any(f"{comms} DeepSpeed comms-logger lines" in n and "--from-comms-log" in n
                              for n in result["notes"])


def test_cli_prints_a_table(plans, capsys):
    code, out, _ = run(capsys, "--from-log", str(MEGATRON), "--plan", str(plans["megatron"]))
    assert code == 0
    assert "step time" in out and "peak memory per device" in out and "as logged" in out
    times = [number(after(ln, "(ms):")) / 1e3 for ln in body(MEGATRON) if "(ms):" in ln][2:]
    assert f"{statistics.median(times):,.4g}" in out
    assert "does not state its sequence length, world size" in out


@pytest.mark.parametrize("log, plan, field", [
    (LUMI, "lumi-batch512", "job.global_batch"),  # the arguments block's global_batch_size
    (ALCF, "alcf-seq2048", "job.seq_len"),        # each iteration line's actual seqlen
    (TITAN, "titan-dp4", "mesh.dp_shard"),        # torchtitan's device-mesh line
    (MEGATRON, "titan", "job.global_batch"),      # each iteration line's global batch size
])
def test_cli_refuses_a_plan_the_log_did_not_run(plans, capsys, log, plan, field):
    code, out, err = run(capsys, "--from-log", str(log), "--plan", str(plans[plan]), "--warmup", "0")
    assert code == 2 and out == ""
    assert f"error: {field}:" in err and str(log) in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_a_log_without_iteration_lines(plans, capsys, tmp_path):
    f = tmp_path / "train.out"
    f.write_text("loading checkpoint\nnothing else\n")
    code, _, err = run(capsys, "--from-log", str(f), "--plan", str(plans["lumi"]))
    assert code == 2 and str(f) in err and "no iteration lines" in err
    code, _, err = run(capsys, "--from-log", str(MEGATRON), "--plan", str(plans["lumi"]), "--log-format", "torchtitan")
    assert code == 2 and str(MEGATRON) in err and "no torchtitan iteration lines" in err


def test_cli_refuses_options_out_of_place(plans, capsys):
    assert run(capsys, "--plan", str(plans["lumi"]))[0] == 2
    assert run(capsys, "--from-log", str(LUMI))[2].strip().endswith("give the plan file the run was made from")
    code, _, err = run(capsys, "--from-log", str(LUMI), "--plan", str(plans["lumi"]), "--warmup", "4")
    assert code == 2 and "--warmup" in err
    code, _, err = run(capsys, "--from-log", str(LUMI), "--plan", str(plans["lumi"]), "--from-comms-log", str(LUMI))
    assert code == 2 and "--from-comms-log" in err


# ------------------------------------------------------------------------------------- recorded for a refit


def test_recorded_run_is_one_the_refit_takes(plans, capsys, tmp_path):
    from calibration.fit_runs import load_runs

    rec = tmp_path / "runs" / "alcf-tp2-zero2"
    code, out, _ = run(capsys, "--from-log", str(ALCF), "--plan", str(plans["alcf"]), "--warmup", "0", "--record",
                       str(rec), "--json")
    assert code == 0 and json.loads(out)["recorded"] == str(rec)
    assert (rec / "plan.yaml").read_text() == plans["alcf"].read_text()
    summary = json.loads((rec / "summary.json").read_text())
    times = [number(after(ln, "(ms):")) / 1e3 for ln in body(ALCF) if "(ms):" in ln]
    assert summary["measured_step_time_s"] == pytest.approx(statistics.median(times))
    assert summary["peak_memory_gib"] is None and summary["log_format"] == "megatron-deepspeed"
    (run_,) = load_runs([rec])
    assert run_.measured_step_time_s == pytest.approx(statistics.median(times)) and run_.measured_forward_backward_s is None
    fitted = tmp_path / "fitted.yaml"
    code, _, _ = run(capsys, "--from-runs", str(rec), "--base", "dgx-a100-40gb", "-o", str(fitted))
    assert code == 0 and "alcf-tp2-zero2" in fitted.read_text()
    # a second record into the same folder is refused; nothing is overwritten
    code, _, err = run(capsys, "--from-log", str(ALCF), "--plan", str(plans["alcf"]), "--warmup", "0", "--record", str(rec))
    assert code == 2 and "--record" in err


def test_record_refuses_a_plan_of_another_framework_profile(plans, capsys, tmp_path):
    rec = tmp_path / "lumi"
    code, _, err = run(capsys, "--from-log", str(LUMI), "--plan", str(plans["lumi"]), "--warmup", "1", "--record", str(rec))
    assert code == 2 and "error: job.framework:" in err and "'deepspeed'" in err and not rec.exists()


def test_compare_refuses_a_dpo_plan():
    plan = load_plan(Path(__file__).resolve().parents[2] / "plans" / "protein-3.5b_pdx_400n_dpo.yaml")
    with pytest.raises(PlanError) as e:
        compare(read_log(MEGATRON), plan)
    assert e.value.field == "job.workload"
