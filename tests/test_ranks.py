"""One GPU per rank (issue 41): every rank of a multi-GPU job computes on its own GPU, cuda:LOCAL_RANK,
whatever --device said (unset, auto or cuda), and every device call asks that GPU; a job mpirun started
(which sets no LOCAL_RANK) takes its ranks from the MPI launcher's variables, so that accelerate creates the
process group. This machine has no GPU: torch.cuda is a fake that records which GPU each call asked about."""
from __future__ import annotations

import argparse
import os
from types import SimpleNamespace

import pytest

from engine.common.errors import InputError
from engine.core import distributed

GB = 2**30
LAUNCHERS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",   # torchrun's
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
             "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",     # Intel MPI, MPICH
             "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE")


class FakeCuda:
    """torch.cuda on a machine with `count` GPUs of 80 GiB (Ampere or later): `asked` lists (call, GPU index)
    for every call, None where the call named no GPU (torch's current device)."""

    def __init__(self, count: int = 2):
        self.count, self.asked = count, []

    def install(self, monkeypatch) -> "FakeCuda":
        import torch

        for name in ("is_available", "device_count", "mem_get_info", "memory_allocated", "memory_reserved",
                     "get_device_properties", "get_device_name", "get_device_capability", "is_bf16_supported"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self

    def _ask(self, call: str, index):
        self.asked.append((call, None if index is None else int(getattr(index, "index", index) or 0)))

    def is_available(self):
        return True

    def device_count(self):
        return self.count

    def mem_get_info(self, index=None):
        self._ask("mem_get_info", index)
        return 70 * GB, 80 * GB

    def memory_allocated(self, index=None):
        self._ask("memory_allocated", index)
        return 0

    def memory_reserved(self, index=None):
        self._ask("memory_reserved", index)
        return 0

    def get_device_properties(self, index=None):
        self._ask("get_device_properties", index)
        return SimpleNamespace(total_memory=80 * GB, major=9, minor=0, name="NVIDIA H100")

    def get_device_name(self, index=None):
        self._ask("get_device_name", index)
        return "NVIDIA H100"

    def get_device_capability(self, index=None):
        self._ask("get_device_capability", index)
        return 9, 0

    def is_bf16_supported(self, including_emulation=True):
        self._ask("is_bf16_supported", None)   # torch's current device
        return True


@pytest.fixture
def launcher_env(monkeypatch):
    """No launcher's variables: each test sets the ones its launcher would. Those the engine sets itself
    (adopt_mpi_environment) are removed afterwards too: a WORLD_SIZE left behind would make a later test's
    command join a job of several processes."""
    absent = [name for name in LAUNCHERS if name not in os.environ]
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    monkeypatch.undo()
    for name in absent:
        os.environ.pop(name, None)


@pytest.mark.parametrize("given", [None, "auto", "cuda"])
def test_every_rank_computes_on_its_own_gpu_whatever_device_says(given, launcher_env):
    """Rank 1 of a job on 2 GPUs (accelerate's device for it: cuda:1) with --device unset, auto or cuda."""
    launcher_env.setenv("WORLD_SIZE", "2")
    launcher_env.setattr(distributed, "join", lambda: SimpleNamespace(device="cuda:1", shard=False))
    args = argparse.Namespace(device=given, command="generate", shard=None, quiet=True)
    distributed.cli_join(args)
    assert args.device == "cuda:1"


@pytest.mark.parametrize("given", ["cuda:0", "cpu"])
def test_a_device_named_outright_is_kept(given, launcher_env):
    launcher_env.setenv("WORLD_SIZE", "2")
    launcher_env.setattr(distributed, "join", lambda: SimpleNamespace(device="cuda:1", shard=False))
    args = argparse.Namespace(device=given, command="generate", shard=None, quiet=True)
    distributed.cli_join(args)
    assert args.device == given


def test_every_device_call_of_a_rank_asks_its_own_gpu(monkeypatch, tmp_path):
    """On cuda:1 the memory, the budget, bf16, the status line and diffusers' offload decision all ask GPU 1
    (a call without an index asks torch's current device, GPU 0 unless set)."""
    import torch

    from engine.backends import device as devices
    from engine.backends import diffusers_generator
    from engine.core.engine import _memory_summary

    cuda = FakeCuda().install(monkeypatch)
    assert devices.pick_device("cuda:1") == "cuda:1"
    assert devices.memory_info("cuda:1")["free"] == 70 * GB
    assert devices.DeviceMemory().total_bytes("cuda:1") == 80 * GB
    assert devices.DeviceMemory().available_bytes("cuda:1") == 70 * GB
    assert devices.default_budget_bytes("cuda:1") == int(80 * GB - devices.CUDA_RESERVE_BYTES)
    assert devices.default_dtype("cuda:1", prefer_bf16=True) == torch.bfloat16
    assert "GPU 1" in _memory_summary("cuda:1")
    pipe = SimpleNamespace(components={"unet": torch.nn.Linear(4, 4)})
    assert diffusers_generator._offload_mode("auto", pipe, "cuda:1", "tiny") is None   # fits GPU 1's free memory
    assert cuda.asked and {index for _, index in cuda.asked} == {1}, cuda.asked


def test_a_job_mpirun_started_gets_its_ranks_and_a_process_group_on_gpu_nodes(launcher_env):
    """mpirun (Open MPI) sets no LOCAL_RANK: accelerate answered DistributedType.NO on GPU nodes and created no
    process group. From the MPI variables the ranks get torch.distributed's, so it picks NCCL on the GPUs."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType
    import torch

    launcher_env.setattr(torch.cuda, "is_available", lambda: True)
    for name, value in (("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "3"),
                        ("OMPI_COMM_WORLD_LOCAL_RANK", "3"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "4")):
        launcher_env.setenv(name, value)
    assert PartialState._prepare_backend(None, cpu=False)[1] == DistributedType.NO    # what accelerate did
    distributed.adopt_mpi_environment()
    assert {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "MASTER_PORT")} == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3",
                                                           "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                                                           "MASTER_PORT": "29500"}
    assert PartialState._prepare_backend(None, cpu=False) == ("nccl", DistributedType.MULTI_GPU)


def test_mpich_and_intel_mpi_ranks_are_read_too_and_several_machines_need_master_addr(launcher_env):
    for name, value in (("PMI_SIZE", "8"), ("PMI_RANK", "5"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "4")):
        launcher_env.setenv(name, value)
    with pytest.raises(InputError, match="MASTER_ADDR"):
        distributed.adopt_mpi_environment()   # 8 ranks, 4 on this machine
    launcher_env.setenv("MASTER_ADDR", "node1")
    distributed.adopt_mpi_environment()
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["MASTER_ADDR"]) == ("5", "1", "node1")
    launcher_env.delenv("MPI_LOCALRANKID")
    launcher_env.delenv("LOCAL_RANK")
    with pytest.raises(InputError, match="local rank"):
        distributed.adopt_mpi_environment()


def test_torchrun_and_accelerate_environments_are_left_as_they_are(launcher_env):
    launcher_env.setenv("LOCAL_RANK", "0")
    launcher_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    distributed.adopt_mpi_environment()
    assert "RANK" not in os.environ and "MASTER_ADDR" not in os.environ


def test_no_launcher_variable_is_left_behind_for_later_tests():
    """What the tests above set (adopt_mpi_environment writes os.environ itself) is gone."""
    assert not [name for name in LAUNCHERS if name in os.environ]
