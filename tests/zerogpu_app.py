"""`python tests/zerogpu_app.py [app.py arguments]`: app.py run as a ZeroGPU Space runs it, on a CPU, for
tests/test_zerogpu.py. The real `spaces` package works as on ZeroGPU (it patches torch, records the
preloaded weights' `.to("cuda")`, packs them and prunes their hub-cache files at launch, forks its GPU
worker and pickles everything that crosses between worker and app). Two things are stubbed, as the
test cannot have them: the scheduler, which the test serves on 127.0.0.1 speaking the ZeroGPU device
API (SPACES_ZERO_DEVICE_API_URL), and the CUDA hand-over in the worker (`spaces.zero.torch.init` and
`move`), which here hands the weights over to this machine's CPU memory instead of a GPU.

Every real CUDA initialisation in the main process (where `spaces` makes it raise) is also appended,
with the process id, to the file $GAPLENS_TEST_CUDA_LOG. $GAPLENS_TEST_GPU_MODEL names the card the NVIDIA
driver's files would name (spaces reads its hardware profile from them): the H200 slice when unset.
"""
import os
import sys
from pathlib import Path

import spaces  # noqa: F401 - first, as app.py imports it on ZeroGPU
import torch
from spaces.zero import torch as zero_torch
from spaces.zero.torch import patching

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def init(nvidia_uuid: str) -> None:
    """The worker's CUDA start-up, stubbed: no CUDA_VISIBLE_DEVICES, no CUDA context."""


def move(callback=None) -> None:
    """The hand-over of the recorded weights, stubbed to land in CPU memory: what was never packed takes
    its original tensor back, what `spaces` packed to disk at launch is read back from its pack file
    (the batches, then the big tensors, each padded to its aligned size, as spaces writes them)."""
    for fake, original in list(patching.cuda_aliases.items()):
        if original is not None:
            fake.data = original
    for pack in patching.tensor_packs:
        with open(pack.path(), "rb") as f:
            for meta, size, aligned in [entry for batch in pack.batches for entry in batch] + pack.big_tensors:
                flat = torch.frombuffer(bytearray(f.read(aligned)[:size]), dtype=torch.uint8).clone()
                tensor = torch.empty(0, dtype=meta.dtype).set_(flat.untyped_storage(), 0, meta.shape, meta.stride())
                for fake in pack.fakes[meta]:
                    fake.data = tensor


zero_torch.init, zero_torch.move = init, move
if os.environ.get("GAPLENS_TEST_GPU_MODEL"):
    # The card spaces.zero.config.get_config looks up in its profiles, read again (importing spaces read the
    # driver's files already), and the fake device spaces shows the main process made of that profile.
    from types import SimpleNamespace

    from spaces.zero import config as zero_config
    from spaces.zero.torch import cudart, static

    zero_config._read_gpu_information = lambda: f"Model: \t\t {os.environ['GAPLENS_TEST_GPU_MODEL']}\n"
    zero_config.get_config.cache_clear()
    profile = zero_config.get_config()
    fake = {"CUDA_DEVICE_NAME": profile["model"], "CUDA_TOTAL_MEMORY": profile["memory"],
            "CUDA_MEM_GET_INFO": (static.compute_base_free_memory(profile["memory"]), profile["memory"]),
            "CUDA_DEVICE_CAPABILITY": (profile["sm_major"], profile["sm_minor"]),
            "CUDA_DEVICE_PROPERTIES": SimpleNamespace(name=profile["model"], major=profile["sm_major"],
                                                      minor=profile["sm_minor"], total_memory=profile["memory"],
                                                      multi_processor_count=profile["sm_count"])}
    for module in (static, patching, cudart):
        for name, value in fake.items():
            if hasattr(module, name):
                setattr(module, name, value)
_guarded_cuda_init = torch._C._cuda_init   # spaces' guard in the main process: it raises


def _recorded_cuda_init():
    with open(os.environ["GAPLENS_TEST_CUDA_LOG"], "a") as log:
        log.write(f"{os.getpid()}\n")
    return _guarded_cuda_init()


torch._C._cuda_init = _recorded_cuda_init

if __name__ == "__main__":
    import app

    app.main(sys.argv[1:])
