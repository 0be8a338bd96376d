"""A network on the CPU: its torch threads beside the decoding workers (the rule, and the
model thread applying it), and its frozen graph (equal outputs, or the module itself where a
graph cannot be made or differs)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from featpipe.extract.cpu_inference import frozen, model_threads  # noqa: E402
from featpipe.extract.streaming import ModelThread  # noqa: E402


@pytest.mark.parametrize(("cores", "jobs", "threads"), [
    (1, 1, 1), (2, 1, 2), (2, 2, 2), (7, 3, 7),  # below 8 cores the workers share them
    (8, 1, 7), (16, 1, 15), (16, 2, 14), (16, 8, 14), (64, 4, 60), (64, 16, 56)])
def test_the_workers_get_a_core_each_from_8_cores_per_worker(monkeypatch, cores, jobs,
                                                             threads):
    monkeypatch.delenv("FEATPIPE_THREADS", raising=False)
    assert model_threads(jobs, cores) == threads


def test_featpipe_threads_sets_the_count_and_the_affinity_gives_the_cores(monkeypatch):
    import os

    monkeypatch.setenv("FEATPIPE_THREADS", "3")
    assert model_threads(1, 16) == 3
    monkeypatch.delenv("FEATPIPE_THREADS")
    cores = len(os.sched_getaffinity(0))
    assert model_threads(1) == cores - min(1, cores // 8)


class ThreadsSeen:
    """A stand-in model that records the torch threads of the thread it runs on."""

    device = "cpu"

    def __init__(self):
        self.seen: list[tuple[int, int]] = []

    def forward_crops(self, crops):
        self.seen.append((threading.get_ident(), torch.get_num_threads()))
        return np.zeros((len(crops), 1), np.float32)


def threads_of_a_new_thread() -> int:
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


def test_the_model_thread_runs_with_its_threads_and_restores_the_default():
    import select

    before, default = torch.get_num_threads(), threads_of_a_new_thread()
    wanted = 1 if before > 1 else 2
    model = ThreadsSeen()
    thread = ModelThread(model, 2, (4, 4, 3), "cpu", threads=wanted)
    try:
        buffer = thread.buffer()
        thread.submit(buffer, 2, "tag")
        while thread.busy:
            select.select([thread.wake], [], [], 10)
            thread.results()
    finally:
        thread.close()
    (ident, threads), = model.seen
    assert ident != threading.get_ident() and threads == wanted
    assert torch.get_num_threads() == before  # this thread's count is untouched
    assert threads_of_a_new_thread() == default  # and the process default is restored


def small_network():
    """Convolution, batch norm (non-trivial statistics), ReLU, pooling: what freezing folds
    and fuses."""
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten())
    with torch.no_grad():
        for module in net:
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return net.eval()


def example(n=2):
    return torch.randn(n, 3, 20, 20, generator=torch.Generator().manual_seed(1))


def test_a_frozen_graph_gives_the_modules_outputs_at_any_batch_size():
    net = small_network()
    graph = frozen(net, example())
    assert isinstance(graph, torch.jit.ScriptModule)
    batch = torch.randn(5, 3, 20, 20, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got, expected = graph(batch), net(batch)
    assert got.shape == (5, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_a_graph_that_fixed_the_batch_size_is_not_used():
    from torch import nn

    class FixedBatch(nn.Module):  # a Python int taken from the shape: the trace keeps it
        def forward(self, x):
            return x.reshape(int(x.shape[0]), -1).sum(1)

    module = FixedBatch().eval()
    assert frozen(module, example()) is module


def test_a_module_that_cannot_be_traced_is_kept():
    from torch import nn

    class NotATensor(nn.Module):
        def forward(self, x):
            return {"sizes": list(x.shape)}

    module = NotATensor().eval()
    assert frozen(module, example()) is module
