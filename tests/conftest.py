"""Test-wide numerics settings (docs/numerics.md §0.2.7) and the `gpu` marker.

Without a CUDA GPU, `gpu`-marked tests are deselected at collection (they would only skip; thousands of `s`
lines hid the real results) and the terminal summary says how many, in one line. Asking for them explicitly
(`-m gpu`, or any `-m` naming `gpu`) keeps them collected and skipped with the reason instead. With a GPU
nothing changes: `pytest -m gpu` collects them all. A test that takes the `cuda_device` fixture is marked `gpu`
here, so `-m gpu` runs it on a GPU machine and a CPU-only run leaves it out.

Under pytest-xdist each worker gets its share of the cores as torch threads (as `harness.pool` gives its
workers): n workers each running every core's worth of intra-op threads on small tensors spend their time
contending (on 2 cores, 2 workers: `test_input_key_groups_only_cases_with_identical_inputs` 76 s wall and 114 s CPU
alone with 2 threads, 49 s and 49 s with 1). The bits do not depend on the thread count.
"""

import os

import pytest
import torch

# NUMERICS: §0.2.7 - no TF32, keep subnormals.
torch.set_float32_matmul_precision("highest")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_flush_denormal(False)

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

NO_GPU = "no CUDA GPU is visible (torch.cuda.is_available() is False)"
_LEFT_OUT = "gpu_tests_left_out"
_LEFT_OUT_KEY = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: a test that takes `cuda_device` is a gpu test too
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cuda_device" in getattr(item, "fixturenames", ()) and item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.gpu)
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    if "gpu" in (config.getoption("markexpr", "") or ""):
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU; {NO_GPU}")
        for item in gpu:
            item.add_marker(skip)
        return
    gpu_ids = {id(item) for item in gpu}
    items[:] = [item for item in items if id(item) not in gpu_ids]
    config.hook.pytest_deselected(items=gpu)
    config.stash[_LEFT_OUT_KEY] = len(gpu)



def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)  # an xdist worker: hand the count to the controller
    if workeroutput is not None:
        workeroutput[_LEFT_OUT] = session.config.stash.get(_LEFT_OUT_KEY, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    count = getattr(node, "workeroutput", {}).get(_LEFT_OUT, 0)
    config = node.config
    config.stash[_LEFT_OUT_KEY] = max(config.stash.get(_LEFT_OUT_KEY, 0), count)


def pytest_terminal_summary(terminalreporter, config):
    left_out = config.stash.get(_LEFT_OUT_KEY, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} gpu-marked tests not collected: {NO_GPU}; run them on a GPU machine "
                                    "(pytest -m gpu)")


@pytest.fixture
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.device("cuda")
