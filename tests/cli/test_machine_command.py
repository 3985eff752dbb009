"""`exaplan machine show / new / detect` (issue 51): complete, commented machine files that read
back as the machine they describe; --set on any field (the launch section included), each
change marked; detection from recorded tool outputs (tests/cli/data/machine_detect/) and on this
machine; bad input exits 2 naming the field and writes nothing."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest
import yaml

import machine_models.detect as detect
import machine_models.loader as loader
from cli.main import main
from machine_models import list_machines, load_machine
from planner.schema.specs import MachineModel

DATA = Path(__file__).parent / "data" / "machine_detect"
H100 = DATA / "h100x4"
BRIEF = ["--set", "devices_per_node=4", "--set", "nics_per_node=4", "--set", "nic_gbit_s=200"]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loader, "LOCAL_FILE", tmp_path / "no-local.yaml")  # `local` is detected, not calibrated


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def load_quietly(path) -> MachineModel:
    """load_machine, failing on any warning (a complete file names no unknown device kind)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_machine(str(path))


def recorded(files: dict[str, Path]):
    """A command runner that answers from recorded outputs; every other tool is missing."""
    def run_command(argv):
        for key, path in files.items():
            if detect.COMMANDS[key] == argv:
                return path.read_text(), ""
        return None, "not installed"
    return run_command


H100_TOOLS = {"nvidia": H100 / "nvidia-smi-query.txt", "nvidia_topo": H100 / "nvidia-smi-topo.txt",
              "lscpu": H100 / "lscpu.json"}


# --- show ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list_machines())
def test_show_reads_back_as_the_preset_for_every_preset(capsys, tmp_path, name):
    rc, out, err = run(capsys, "machine", "show", name)
    assert rc == 0, err
    path = tmp_path / f"{name}-full.yaml"
    path.write_text(out)
    assert load_quietly(path) == load_machine(name)
    keys = set(yaml.safe_load(out))
    expected = set(MachineModel.model_fields)
    machine = load_machine(name)
    for section in ("launch", "power"):
        if getattr(machine, section) is None:
            expected.discard(section)
            assert f"# {section}: not set." in out
    assert keys == expected  # every field, written out


def test_show_comments_every_field_and_writes_the_device_kind_out(capsys):
    rc, out, _ = run(capsys, "machine", "show", "dgx-h100")
    assert rc == 0
    lines = out.splitlines()
    fields = [i for i, line in enumerate(lines) if re.match(r"^[a-z_]+:", line)]
    assert len(fields) == len(MachineModel.model_fields)
    assert all(lines[i - 1].startswith("#") for i in fields)  # a comment above every field
    launch = [line for line in lines[lines.index("launch:"):lines.index("power:")] if line.startswith("  ")]
    assert all(a.startswith("  #") for a, b in zip(launch, launch[1:]) if re.match(r"^  [a-z_]+:", b))
    assert "# Ranks per node: a GPU, or a tile/GCD where each runs its own rank." in out
    assert "[from the device kind 'NVIDIA H100 SXM5', device_kinds.yaml]" in out
    assert "runtime_kernels:" in out and "attention_tflops:" in out  # the kind's measured kernels, inherited
    assert "launch:" in out and "ib_hca: mlx5" in out and "power:" in out
    assert "#   device_w 700: NVIDIA H100 datasheet" in out  # the section's sources, kept above it
    assert "# Sources, figure by figure:" in out


def test_show_takes_a_path(capsys, tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text((loader.PRESET_DIR / "leonardo.yaml").read_text().replace("name: leonardo", "name: mine"))
    rc, out, err = run(capsys, "machine", "show", str(own))
    assert rc == 0, err
    full = tmp_path / "mine-full.yaml"
    full.write_text(out)
    assert load_quietly(full) == load_machine(str(own))


def test_show_of_an_unknown_machine_exits_2(capsys):
    rc, out, err = run(capsys, "machine", "show", "dgx-h10")
    assert rc == 2 and out == ""
    assert err.startswith("exaplan machine: error: machine: unknown machine 'dgx-h10'") and "Traceback" not in err


# --- new -------------------------------------------------------------------------------------------


def test_new_writes_the_changed_figures_and_marks_them(capsys, tmp_path):
    rc, out, err = run(capsys, "machine", "new", "--like", "dgx-h100", *BRIEF, "-o", "my-cluster.yaml")
    assert rc == 0, err
    assert "wrote my-cluster.yaml" in out and "devices_per_node: 8 -> 4" in out
    text = (tmp_path / "my-cluster.yaml").read_text()
    mine, h100 = load_quietly(tmp_path / "my-cluster.yaml"), load_machine("dgx-h100")
    assert (mine.devices_per_node, mine.nics_per_node, mine.nic_gbit_s) == (4, 4, 200.0)
    assert mine.name == "my-cluster"
    assert mine.launch.ranks_per_node == 4 and mine.launch.gpus_per_node == 4  # follow devices_per_node
    assert "devices_per_node: 4  # set by you (was 8, dgx-h100)" in text
    assert "nics_per_node: 4  # set by you (was 8, dgx-h100)" in text
    assert "nic_gbit_s: 200.0  # set by you (was 400.0, dgx-h100)" in text
    assert "ranks_per_node: 4  # follows devices_per_node (was 8, dgx-h100)" in text
    assert text.startswith("# my-cluster: a machine file made from dgx-h100 by exaplan machine new")
    same = {"name", "description", "devices_per_node", "nics_per_node", "nic_gbit_s", "launch"}
    for field in set(MachineModel.model_fields) - same:
        assert getattr(mine, field) == getattr(h100, field), field
    assert mine.launch.cpu_sets == []  # the 8 ranks' core sets do not fit 4 ranks: cleared, not guessed
    assert mine.launch.model_copy(update=dict(ranks_per_node=8, gpus_per_node=8, cpu_sets=h100.launch.cpu_sets)) == h100.launch


def test_new_file_plans(capsys, tmp_path):
    assert run(capsys, "machine", "new", "--like", "dgx-h100", *BRIEF, "--set", "nodes=32", "-o", "c.yaml")[0] == 0
    rc, out, err = run(capsys, "plan", "--model", "protein-tiny", "--machine", "c.yaml", "--nodes", "32", "--json",
                       "--top", "1", "-o", "p.yaml")
    assert rc == 0, err
    assert '"world_size": 128' in out


def test_new_sets_launch_fields(capsys, tmp_path):
    rc, _, err = run(capsys, "machine", "new", "--like", "dgx-h100", "--set", "launch.default_scheduler=torchrun",
                     "--set", "launch.account_required=true", "--set", "launch.env.NCCL_IB_TIMEOUT=22",
                     "--set", "launch.cpus_per_rank=12", "--set", "peak_tflops.bf16=900", "--name", "site",
                     "-o", "site.yaml")
    assert rc == 0, err
    m = load_quietly(tmp_path / "site.yaml")
    assert m.name == "site" and m.peak_tflops["bf16"] == 900.0
    assert m.launch.default_scheduler.value == "torchrun" and m.launch.account_required
    assert m.launch.env == {"NCCL_IB_TIMEOUT": "22"} and m.launch.cpus_per_rank == 12
    text = (tmp_path / "site.yaml").read_text()
    assert "default_scheduler: torchrun  # set by you (was slurm, dgx-h100)" in text
    assert "NCCL_IB_TIMEOUT: '22'  # set by you (was unset, dgx-h100)" in text
    assert "bf16: 900.0  # set by you (was 989.0, dgx-h100)" in text


def test_new_makes_a_launch_section_for_a_preset_without_one(capsys, tmp_path):
    assert load_machine("grand-teton-h100").launch is None
    rc, _, err = run(capsys, "machine", "new", "--like", "grand-teton-h100", "--set", "launch.default_scheduler=slurm",
                     "-o", "gt.yaml")
    assert rc == 0, err
    m = load_quietly(tmp_path / "gt.yaml")
    assert m.launch.default_scheduler.value == "slurm" and m.launch.ranks_per_node == 8
    assert [s.value for s in m.launch.schedulers] == ["slurm", "torchrun"]


def test_new_with_another_device_name_takes_that_kinds_figures(capsys, tmp_path):
    rc, _, err = run(capsys, "machine", "new", "--like", "dgx-h100", "--set", "device_name=NVIDIA A100 SXM4",
                     "-o", "a100.yaml")
    assert rc == 0, err
    m, a100 = load_quietly(tmp_path / "a100.yaml"), load_machine("dgx-a100-80gb")
    for field in ("matmul_efficiency", "attention_efficiency_factor", "elementwise_reference_gbyte_s", "overlap"):
        assert getattr(m, field) == getattr(a100, field), field
    assert m.runtime_kernels is None  # the H100's measured kernels stay with the H100
    assert m.peak_tflops == load_machine("dgx-h100").peak_tflops  # the file's own figure: yours to set
    text = (tmp_path / "a100.yaml").read_text()
    assert "attention_efficiency_factor: 1.0  # follows device_name: NVIDIA A100 SXM4's figure" in text


@pytest.mark.parametrize("setting, named", [
    ("devices_per_nod=4", "devices_per_nod: unknown field (did you mean 'devices_per_node'"),
    ("launch.scheduler=slurm", "launch.scheduler: unknown field (did you mean 'schedulers' or 'default_scheduler'?)"),
    ("nic_gbps=200", "nic_gbps: renamed to 'nic_gbit_s'"),
    ("nodes.max=3", "nodes.max: nodes is a single value, not a section"),
    ("devices_per_node=0", "devices_per_node: Input should be greater than 0"),
    ("nic_gbit_s=fast", "nic_gbit_s: Input should be a valid number"),
    ("launch.env.LD_PRELOAD=x.so", "launch.env: LD_PRELOAD is refused"),
    ("devices_per_node", "--set takes FIELD=VALUE"),
])
def test_bad_set_exits_2_naming_the_field_and_writes_nothing(capsys, tmp_path, setting, named):
    rc, out, err = run(capsys, "machine", "new", "--like", "dgx-h100", "--set", setting, "-o", "bad.yaml")
    assert rc == 2 and out == ""
    assert named in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "bad.yaml").exists()


def test_an_existing_file_is_refused_without_force_and_kept(capsys, tmp_path):
    target = tmp_path / "my-cluster.yaml"
    target.write_text("mine\n")
    rc, _, err = run(capsys, "machine", "new", "--like", "dgx-h100", *BRIEF, "-o", str(target))
    assert rc == 2 and "exists: give --force" in err
    assert target.read_text() == "mine\n"
    rc, _, err = run(capsys, "machine", "detect", "-o", str(target))
    assert rc == 2 and target.read_text() == "mine\n"
    rc, _, err = run(capsys, "machine", "new", "--like", "dgx-h100", *BRIEF, "-o", str(target), "--force")
    assert rc == 0, err
    assert load_quietly(target).devices_per_node == 4


def test_help_explains_with_examples(capsys):
    for action, example in (("show", "exaplan machine show dgx-h100"),
                            ("new", "--set devices_per_node=4 --set nics_per_node=4"),
                            ("detect", "exaplan machine detect -o my-cluster.yaml")):
        with pytest.raises(SystemExit) as done:
            main(["machine", action, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out and example in out


# --- detect: the probes on recorded outputs ---------------------------------------------------------


def test_nvidia_probes_read_a_4_x_h100_node():
    gpus = detect.parse_nvidia_smi((H100 / "nvidia-smi-query.txt").read_text())
    assert (gpus.name, gpus.ranks, gpus.memory_gib) == ("NVIDIA H100 80GB HBM3", 4, 79.6)
    assert detect.device_kind(gpus) == "NVIDIA H100 SXM5"
    links = detect.parse_nvidia_topo((H100 / "nvidia-smi-topo.txt").read_text())
    assert links.measured and links.gbyte_s == 450.0  # NV6 to each of 3 peers: 18 links


def test_topo_of_an_nvswitch_node_and_of_pcie_gpus():
    def matrix(cells):
        head = "\t" + "\t".join(f"GPU{i}" for i in range(len(cells))) + "\tCPU Affinity\n"
        rows = [f"GPU{i}\t" + "\t".join(" X " if i == j else c for j in range(len(cells))) + "\t0-55\n"
                for i, c in enumerate(cells)]
        return head + "".join(rows)
    assert detect.parse_nvidia_topo(matrix(["NV18"] * 8)).gbyte_s == 450.0  # DGX H100: the switch's 18 links
    assert detect.parse_nvidia_topo(matrix(["NV12"] * 8)).gbyte_s == 300.0  # DGX A100
    pcie = detect.parse_nvidia_topo(matrix(["SYS"] * 4))
    assert not pcie.measured and pcie.gbyte_s == detect.PCIE_GBYTE_S
    assert detect.parse_nvidia_topo("No devices were found") is None


def test_amd_and_intel_probes():
    amd = detect.parse_rocm_smi((DATA / "amd-mi250x" / "rocm-smi.json").read_text())
    assert (amd.ranks, amd.memory_gib, detect.device_kind(amd)) == (8, 64.0, "AMD MI250X GCD")
    intel = detect.parse_xpu_smi((DATA / "intel-max1550" / "xpu-smi-discovery.txt").read_text(),
                                 (DATA / "intel-max1550" / "xpu-smi-discovery-d0.txt").read_text())
    assert (intel.ranks, intel.memory_gib, detect.device_kind(intel)) == (12, 64.0, "Intel Max 1550 tile")
    assert detect.parse_rocm_smi("not json") is None and detect.parse_xpu_smi("") is None


def test_cpu_probes_read_nested_and_flat_lscpu():
    h100 = detect.parse_lscpu((H100 / "lscpu.json").read_text())
    assert (h100.sockets, h100.cores_per_socket, h100.numa_nodes, h100.cores) == (2, 48, 2, 96)
    assert h100.model == "Intel(R) Xeon(R) Platinum 8468"
    here = detect.parse_lscpu((DATA / "cpu-only" / "lscpu.json").read_text())
    assert (here.sockets, here.cores_per_socket) == (1, 2)
    assert detect.parse_lscpu("{}") is None


def test_nic_probes_choose_the_infiniband_ports():
    ports = detect.read_files(H100 / "sys/class/infiniband", 3)
    nics = detect.parse_ib_ports(ports)
    chosen, others = detect.choose_nics(nics)
    assert [n.device for n in chosen] == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1"]
    assert {n.gbit_s for n in chosen} == {200.0} and [n.device for n in others] == ["mlx5_4/1"]
    ibv = detect.parse_ibv_devinfo((H100 / "ibv_devinfo-v.txt").read_text())
    assert [(n.device, n.gbit_s, n.active) for n in ibv] == [("mlx5_0/1", 200.0, True), ("mlx5_1/1", 200.0, True),
                                                             ("mlx5_4/1", 100.0, False)]
    assert detect.parse_net_speeds(detect.read_files(DATA / "cpu-only/sys/class/net", 1)) == []  # speed -1
    eth = detect.parse_net_speeds(detect.read_files(H100 / "sys/class/net", 1))
    assert [(n.device, n.gbit_s) for n in eth] == [("ens5f0np0", 100.0)]  # not lo, not the IPoIB ib*


def test_scheduler_from_the_environment():
    assert detect.scheduler_from_env({"SLURM_JOB_ID": "42"}) == "slurm"
    assert detect.scheduler_from_env({"PBS_JOBID": "7.aurora-pbs"}) == "pbs"
    assert detect.scheduler_from_env({}) is None


def test_commands_run_with_a_timeout(monkeypatch):
    assert detect.run_command(["exaplan-no-such-tool"]) == (None, "not installed")
    monkeypatch.setattr(detect, "TIMEOUT_S", 0.5)
    text, why = detect.run_command([sys.executable, "-c", "import time; time.sleep(10)"])
    assert text is None and why == "no answer in 0.5 s"
    text, why = detect.run_command([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert text is None and why.startswith("exit code 3")


# --- detect: the command ----------------------------------------------------------------------------


def test_detect_a_4_x_h100_node_from_recorded_outputs(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(detect, "run_command", recorded(H100_TOOLS))
    monkeypatch.setattr(detect, "SYS_ROOT", H100)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    rc, out, err = run(capsys, "machine", "detect", "-o", "my-cluster.yaml")
    assert rc == 0, err
    m = load_quietly(tmp_path / "my-cluster.yaml")
    assert (m.device_name, m.devices_per_node, m.device_memory_gib) == ("NVIDIA H100 SXM5", 4, 79.6)
    assert (m.nics_per_node, m.nic_gbit_s, m.intra_node_bandwidth_gbyte_s) == (4, 200.0, 450.0)
    assert m.collective_library.value == "nccl" and m.name == "my-cluster"
    assert m.launch.default_scheduler.value == "slurm" and m.launch.ranks_per_node == 4
    assert m.launch.cpus_per_rank == 24 and m.launch.gpus_per_node == 4
    assert m.launch.ib_hca == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"  # not the Ethernet storage port
    h100 = load_machine("dgx-h100")  # the closest preset: the rest is its
    assert m.peak_tflops == h100.peak_tflops and m.matmul_efficiency == h100.matmul_efficiency
    text = (tmp_path / "my-cluster.yaml").read_text()
    assert "devices_per_node: 4  # detected: nvidia-smi" in text
    assert "inter_node_latency_us: 3.0  # unknown: measure with exaplan calibrate --arrival (dgx-h100's)" in text
    assert "nodes: 1024  # unknown: dgx-h100's; set it for your cluster" in text
    assert "starting from dgx-h100" in text
    assert "note: left out of the NICs" in err and "mlx5_4/1 100 Gb/s Ethernet" in err
    assert "4 x NVIDIA H100 80GB HBM3 (nvidia-smi)" in out


def test_detect_with_a_like_of_another_kind_takes_the_detected_kinds_figures(tmp_path):
    node = detect.probe_node(recorded(H100_TOOLS), H100, {})
    made = detect.detected_machine(node, "dgx-a100-80gb", "mixed", "2026-12-01")
    h100 = load_machine("dgx-h100")
    assert made.machine.device_name == "NVIDIA H100 SXM5"
    assert made.machine.matmul_efficiency == h100.matmul_efficiency and made.machine.runtime_kernels is not None
    assert "attention_efficiency_factor: 0.593  # unknown: measure with exaplan calibrate --arrival" in made.text


def test_detect_amd_and_intel_nodes_start_from_their_presets(tmp_path):
    amd = detect.probe_node(recorded({"rocm": DATA / "amd-mi250x/rocm-smi.json"}), tmp_path, {"PBS_JOBID": "1"})
    made = detect.detected_machine(amd, None, "amd", "2026-12-01")
    assert made.machine.devices_per_node == 8 and made.machine.collective_library.value == "rccl"
    assert "starting from frontier" in made.text
    intel = detect.probe_node(recorded({"xpu": DATA / "intel-max1550/xpu-smi-discovery.txt",
                                        "xpu_device": DATA / "intel-max1550/xpu-smi-discovery-d0.txt"}),
                              tmp_path, {"PBS_JOBID": "1"})
    made = detect.detected_machine(intel, None, "intel", "2026-12-01")
    assert (made.machine.devices_per_node, made.machine.device_memory_gib) == (12, 64.0)
    assert made.machine.launch.default_scheduler.value == "pbs"
    assert len(made.machine.launch.cpu_sets) == 12  # aurora's, kept: for 12 ranks
    assert "starting from aurora" in made.text
    assert "no RDMA NIC" in " ".join(intel.missing)


def test_detect_without_gpus_writes_a_local_like_machine(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(detect, "run_command", recorded({"lscpu": DATA / "cpu-only/lscpu.json"}))
    monkeypatch.setattr(detect, "SYS_ROOT", DATA / "cpu-only")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("PBS_JOBID", raising=False)
    rc, _, err = run(capsys, "machine", "detect", "-o", "cpu.yaml")
    assert rc == 0, err
    m = load_quietly(tmp_path / "cpu.yaml")
    local = loader.detect_local_machine(loader.DEFAULT_LOCAL_RANKS)
    assert m.collective_library.value == "gloo" and m.devices_per_node == local.devices_per_node
    assert m.peak_tflops == local.peak_tflops
    assert m.launch.default_scheduler.value == "torchrun" and m.launch.ranks_per_node == m.devices_per_node  # local's kind
    assert "not found: no GPU (nvidia-smi: not installed; rocm-smi: not installed; xpu-smi: not installed)" in err
    assert "not found: the scheduler" in err


def test_detect_with_a_gpu_preset_on_a_node_without_gpus_marks_them(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(detect, "run_command", recorded({}))
    monkeypatch.setattr(detect, "SYS_ROOT", tmp_path)
    rc, _, err = run(capsys, "machine", "detect", "--like", "dgx-h100", "-o", "login.yaml")
    assert rc == 0, err
    text = (tmp_path / "login.yaml").read_text()
    assert "devices_per_node: 8  # not detected: no GPU tool answered (dgx-h100's)" in text
    assert "the CPUs (lscpu -J: not installed)" in err


def test_detect_refuses_an_unknown_like_before_probing(capsys, monkeypatch):
    monkeypatch.setattr(detect, "probe_node", lambda *a, **k: pytest.fail("probed"))
    rc, _, err = run(capsys, "machine", "detect", "--like", "nope", "-o", "x.yaml")
    assert rc == 2 and "unknown machine 'nope'" in err and not Path("x.yaml").exists()


def test_detect_on_this_machine_writes_a_file_that_loads(capsys, tmp_path):
    rc, out, err = run(capsys, "machine", "detect", "-o", "here.yaml")
    assert rc == 0, err
    m = load_quietly(tmp_path / "here.yaml")
    assert m.name == "here" and "wrote here.yaml" in out
    if detect.run_command(detect.COMMANDS["nvidia"])[0] is None:  # this machine has no NVIDIA GPU
        assert m.collective_library.value in ("gloo", "rccl", "oneccl") and "not found" in err
