"""Reading a rank's place from each launcher's environment, and refusing a mismatched plan."""

import pytest

from planner.schema.errors import PlanError
from runtime import launch

LAUNCHERS = {
    "torchrun": {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"},
    "slurm": {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)"},
    "pals": {"PALS_RANKID": "5", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "4"},
    "mpiexec": {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
}
ALL_VARS = {k for env in LAUNCHERS.values() for k in env} | {"MASTER_ADDR", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE"}


@pytest.fixture
def clean_env(monkeypatch):
    for k in ALL_VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_each_launcher_gives_rank_world_and_local_rank(name, clean_env):
    for k, v in LAUNCHERS[name].items():
        clean_env.setenv(k, v)
    env = launch.detect()
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size) == (name, 5, 8, 1, 4)


def test_not_launched(clean_env):
    assert launch.detect() is None


def test_rendezvous_on_the_first_host(clean_env, tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1001c0s0b0n0\nx1001c0s0b0n1\n")
    clean_env.setenv("PBS_NODEFILE", str(nodefile))
    assert launch._first_host() == "x1001c0s0b0n0"
    clean_env.setenv("MASTER_ADDR", "10.0.0.7")
    assert launch._first_host() == "10.0.0.7"


class _Plan:
    world_size, nodes, ranks_per_node = 8, 2, 4


def test_mismatched_world_or_node_size_is_refused():
    ok = launch.RankEnv(0, 8, 0, 4, "slurm", "h", 29500)
    launch.check_world(_Plan(), ok)
    with pytest.raises(PlanError, match="needs 8 ranks"):
        launch.check_world(_Plan(), launch.RankEnv(0, 16, 0, 4, "slurm", "h", 29500))
    with pytest.raises(PlanError, match="4 ranks on each node"):
        launch.check_world(_Plan(), launch.RankEnv(0, 8, 0, 8, "slurm", "h", 29500))


def test_multi_node_plan_is_not_started_locally():
    with pytest.raises(PlanError, match="spans 2 nodes"):
        launch.spawn_local(_Plan(), [])
