"""Issue 52's binding and script faults: every Slurm and PBS script binds each rank to cores
near its device (the machine files' cpu_sets, cited there); UCX gets device names in its own
device:port form; a container sees the GPUs; a run that ends resets the requeue count. Each
failed on the earlier scripts (Alps, Leonardo and PDX bound nothing; UCX_NET_DEVICES=mlx5;
`apptainer exec` without --nv; the count never reset)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from cli.main import main as cli_main
from launch.schedulers import cpu_mask
from launch.script import ucx_net_devices
from machine_models import load_machine
from planner.schema.launch import cpu_set_cores

SCHEDULED = ["aurora", "alps", "frontier", "leonardo", "pdx", "dgx-a100-80gb", "dgx-a100-40gb", "dgx-h100",
             "dgx-h200", "lumi"]
UNBOUND = {"ibm-a100-400g": "cores per rank not published for IBM's nodes (machine file)"}


def _script(tmp: Path, machine: str, scheduler: str, *extra: str) -> str:
    m = load_machine(machine)
    plan = tmp / f"{machine}.yaml"
    if not plan.exists():
        r = m.devices_per_node
        assert cli_main(["estimate", "--model", "protein-tiny", "--machine", machine, "--nodes", "2", "--tp", "1",
                         "--pp", "1", "--dp", str(2 * r), "--mbs", "1", "--global-batch", str(2 * r), "--shard", "none",
                         "--recompute", "none", "-o", str(plan)]) == 0
    script = tmp / f"{machine}-{scheduler}-{len(extra)}.sh"
    assert cli_main(["launch", str(plan), "--scheduler", scheduler, "--account", "PRJ", "--out", str(tmp / "out"),
                     "-o", str(script), "--force", *extra]) == 0
    return script.read_text()


@pytest.mark.parametrize("machine", SCHEDULED)
def test_every_slurm_and_pbs_script_binds_each_rank_to_its_own_cores(machine, tmp_path):
    m = load_machine(machine)
    s = m.launch
    assert len(s.cpu_sets) == s.ranks_per_node, machine
    sets = [set(cpu_set_cores(c)) for c in s.cpu_sets]
    assert all(len(a & b) == 0 for i, a in enumerate(sets) for b in sets[i + 1:]), "ranks share cores"
    if s.cpus_per_rank:
        assert all(len(c) == s.cpus_per_rank for c in sets), (machine, [len(c) for c in sets])
    for kind in (k.value for k in s.schedulers if k.value != "torchrun"):
        text = _script(tmp_path, machine, kind)
        if kind == "slurm":
            masks = re.search(r"--cpu-bind='?mask_cpu:([0-9a-fx,]+)", text)
            assert masks, f"{machine}: srun binds no cores"
            assert masks.group(1).split(",") == [cpu_mask(c) for c in s.cpu_sets]
        else:
            assert "--cpu-bind" in text and "list:" + ":".join(s.cpu_sets) in text


def test_the_machines_left_unbound_are_the_documented_ones():
    from machine_models.loader import PRESET_DIR

    unbound = {p.stem for p in PRESET_DIR.glob("*.yaml") if p.stem not in ("device_kinds", "frameworks", "uncertainty")
               and (m := load_machine(p.stem)).launch is not None and not m.launch.cpu_sets}
    assert unbound == set(UNBOUND)


@pytest.mark.parametrize("hca, ucx", [("mlx5", None), ("mlx5_0,mlx5_3", "mlx5_0:1,mlx5_3:1"), ("mlx5_0:2", "mlx5_0:2"),
                                      ("^mlx5_1", None), ("=mlx5_0", "mlx5_0:1"), ("hsn", None)])
def test_ucx_devices_are_in_ucxs_device_port_form(hca, ucx):
    assert ucx_net_devices(hca) == ucx


def test_a_prefix_hca_gives_nccl_its_prefix_and_ucx_nothing(tmp_path):
    text = _script(tmp_path, "dgx-h100", "slurm")
    assert "export NCCL_IB_HCA=mlx5" in text
    assert "UCX_NET_DEVICES" not in text  # UCX would parse "mlx5" as no device at all
    text = _script(tmp_path, "dgx-h100", "slurm", "--set", "machine.launch.ib_hca=mlx5_0,mlx5_1")
    assert "export UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1" in text


@pytest.mark.parametrize("machine, flag", [("dgx-h100", "--nv"), ("frontier", "--rocm"), ("aurora", None)])
def test_a_container_sees_the_machines_gpus(machine, flag, tmp_path):
    image = tmp_path / "image.sif"
    image.write_text("not really an image\n")
    kind = load_machine(machine).launch.default_scheduler.value
    text = _script(tmp_path, machine, kind, "--container", str(image))
    line = next(ln for ln in text.splitlines() if " exec " in ln or ln.strip().startswith("apptainer exec"))
    if flag:
        assert f"apptainer exec {flag} " in text, line
    else:
        assert "--nv" not in text and "--rocm" not in text


def test_a_run_that_ends_resets_the_requeue_count(tmp_path):
    text = _script(tmp_path, "dgx-h100", "slurm")
    after = text[text.index("# 6. Requeue"):]
    out = tmp_path / "run"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "requeues").write_text("3\n")
    p = subprocess.run(["bash", "-c", f'OUT={out}; JOB_ID=1; rc=0\n{after}'], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert not (out / "logs" / "requeues").exists()
