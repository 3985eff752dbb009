"""Ranking, measured (calibration/ranking.py): Spearman and the pick's regret per job."""

from __future__ import annotations

import pytest

from calibration.ranking import MIN_LAYOUTS, rank_job, ranked_jobs, ranking_summary, speeds
from calibration.validate_rows import ValidationRow


def _row(rid: str, published: float, predicted: float, *, kind: str = "tokens_per_s_per_gpu", step: float = 1.0,
         batch: int = 8, fits: bool = True, gpus: int = 8, model: str = "m", section: str = "X") -> ValidationRow:
    return ValidationRow(id=rid, section=section, model=model, machine="box", device="H100", framework="fsdp",
                         gpus=gpus, layout=rid, kind=kind, unit="", published=published, predicted=predicted,
                         error=predicted / published - 1.0, step_time_s=step, seq_len=1024, global_batch=batch,
                         fits_memory=fits)


def test_order_reversed_gives_minus_one_and_the_regret_of_the_worst():
    # measured speeds 100 < 200 < 400; predicted the other way round: the pick is the slowest
    rows = [_row("a", 100, 300, step=1 / 3), _row("b", 200, 200, step=1 / 2), _row("c", 400, 100, step=1.0)]
    job = rank_job(rows, set())
    assert job.spearman == pytest.approx(-1.0)
    assert job.pick == "a" and job.best == "c"
    assert job.regret == pytest.approx(400 / 100 - 1)


def test_the_pick_is_the_fastest_predicted_to_fit():
    rows = [_row("fast-but-oom", 500, 900, step=1 / 9, fits=False), _row("b", 400, 400, step=1 / 4),
            _row("c", 300, 300, step=1 / 3)]
    job = rank_job(rows, {"b"})
    assert job.pick == "b" and job.best == "fast-but-oom" and job.pick_fits
    assert job.regret == pytest.approx(500 / 400 - 1)
    assert job.fitted == 1
    nothing_fits = rank_job([_row("x", 1, 2, step=0.5, fits=False), _row("y", 2, 1, step=1.0, fits=False)], set())
    assert nothing_fits.pick == "x" and not nothing_fits.pick_fits


def test_a_time_and_a_rate_of_one_job_compare_as_tokens_per_second():
    # the same job published once as an iteration time, once as a rate; the time row's layout
    # is measured 2x slower than predicted, the rate row's exactly as predicted
    slow = _row("time", published=4.0, predicted=2.0, kind="iteration_time_s", step=2.0, batch=16)
    rate = _row("rate", published=1000, predicted=1000, step=3.0, batch=16)
    assert speeds(slow) == pytest.approx((16 * 1024 / 4.0, 16 * 1024 / 2.0))
    assert speeds(rate) == pytest.approx((16 * 1024 / 3.0, 16 * 1024 / 3.0))
    job = rank_job([slow, rate], set())
    assert job.pick == "time" and job.best == "rate"  # predicted 2 s < 3 s, measured 4 s > 3 s
    assert job.regret == pytest.approx(4.0 / 3.0 - 1)
    assert job.spearman == pytest.approx(-1.0)
    assert job.kinds == ["iteration_time_s", "tokens_per_s_per_gpu"]


def test_global_batch_counts_in_the_speed():
    # a layout with twice the batch and 1.5x the step time is the faster one
    small, large = _row("gb8", 100, 100, step=1.0, batch=8), _row("gb16", 100, 100, step=1.5, batch=16)
    job = rank_job([small, large], set())
    assert job.best == "gb16" and job.pick == "gb16" and job.regret == 0.0


def test_jobs_are_grouped_by_source_model_and_world_and_summarised():
    fitted = [_row(f"p{i}", 100 + i, 100 + i, step=1 / (100 + i)) for i in range(MIN_LAYOUTS)]
    held = [_row("q0", 50, 60, gpus=16, step=1 / 60), _row("q1", 60, 50, gpus=16, step=1 / 50),
            _row("alone", 10, 10, gpus=32)]
    jobs = ranked_jobs(fitted, held)
    assert [j.layouts for j in jobs] == [MIN_LAYOUTS, 2]
    assert jobs[0].fitted == MIN_LAYOUTS and jobs[1].fitted == 0
    assert jobs[0].held_to_targets and jobs[0].meets_targets and not jobs[1].held_to_targets
    s = ranking_summary(jobs)
    assert (s["jobs"], s["held_to_targets"], s["meet_targets"]) == (2, 1, 1)
    assert s["max_regret"] == 0.0 and s["min_spearman"] == pytest.approx(1.0)


def test_the_published_rows_report_their_ranking():
    """validate --published's own rows: every job's regret is the published data's, recomputed."""
    from calibration.validate_published import validate_held_out, validate_published

    rows, held = validate_published(), validate_held_out()
    jobs = ranked_jobs(rows, held)
    assert len(jobs) >= 10 and any(j.held_to_targets for j in jobs)
    by_id = {r.id: r for r in rows + held}
    for j in jobs:
        measured = {rid: speeds(by_id[rid])[0] for rid in j.rows}
        assert j.regret == pytest.approx(max(measured.values()) / measured[j.pick] - 1)
        assert len({(by_id[r].section, by_id[r].model, by_id[r].seq_len, by_id[r].gpus) for r in j.rows}) == 1


def test_strata_bands_and_coverage():
    from calibration.strata import MIN_STRATUM_ROWS, coverage_by_stratum, short_strata, strata_of

    s = strata_of("H100", "megatron", "zero1", 8, 4608, 8192, 1.77e11)
    assert s == {"device": "H100", "framework": "megatron", "sharding": "zero1", "pipeline": "pp > 1",
                 "world": "> 4,096 GPUs", "seq_len": ">= 8k", "model_size": ">= 100B"}
    assert strata_of("A100", "fsdp", "fsdp", 1, 1, 2048, 3e8)["world"] == "1 GPU"
    assert strata_of("A100", "fsdp", "fsdp", 1, 64, 4096, 1e9)["world"] == "9-64 GPUs"
    rows = []
    for i in range(MIN_STRATUM_ROWS):  # 10 megatron rows, 6 inside: 60% < 70%
        r = _row(f"m{i}", 100, 100)
        r.strata, r.inside_interval = strata_of("H100", "megatron", "zero1", 1, 8, 2048, 1e9), i < 6
        rows.append(r)
    few = _row("f", 100, 100)  # a stratum of one row, outside: not held to the target
    few.strata, few.inside_interval = strata_of("H100", "fsdp", "fsdp", 1, 8, 2048, 1e9), False
    cov = coverage_by_stratum(rows + [few])
    assert cov["framework"]["megatron"] == {"rows": 10, "inside": 0.6, "held_to_target": True, "meets_target": False}
    assert cov["framework"]["fsdp"]["meets_target"] and not cov["framework"]["fsdp"]["held_to_target"]
    assert cov["device"]["H100"]["rows"] == 11
    assert ("framework", "megatron") in [(d, n) for d, n, _ in short_strata(cov)]
