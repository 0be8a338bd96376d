"""A network on the CPU: its torch threads beside the decoding workers, and its graph frozen.

**Threads** (:func:`model_threads`).  The parent runs the network on a thread of its own
(:class:`~featpipe.extract.streaming.ModelThread`) while ``jobs`` decoding workers decode,
resize and crop.  The workers keep a small share of a core busy (f cores, at the network's
rate: VGG-16 fc6 costs about 0.3 s of a core a frame, decoding 5 fps of a 640 × 272 or
320 × 240 video and cropping 3-8 ms a frame, so f is about 0.01-0.03 a core of the
network), but each of their time slices stalls the whole team of the network's threads
(every op waits for its slowest thread).  With every core given to the network the loss is
about f of its time, with one core left to the workers (and to the parent's packing and
writing) it is 1/cores of the network's threads; f grows with the cores (the network runs
faster, so the workers decode more a second), so the second wins from about 8 cores.  The
rule: ``cores - min(jobs, cores // 8)`` torch threads, ``cores`` being those this process
may run on (its CPU affinity: a SLURM task's or ``taskset``'s), at least one; 2 cores: 2
threads, 16 cores and one worker: 15; ``FEATPIPE_THREADS`` sets the count instead (a shared
machine, whose other users' load no affinity shows).

**Frozen graph** (:func:`frozen`): ``torch.jit.trace``, ``torch.jit.freeze`` (parameters
inlined as constants) and ``torch.jit.optimize_for_inference`` (batch norms folded into the
convolutions before them, oneDNN convolutions with prepacked weights and fused ReLUs), the
standard CPU inference recipe of torch 2.x; outputs equal the module's to float32 rounding
(a few 1e-7 of the largest value).  Measured on one core (benchmarks/RESULTS.md, issue 50):
resnet50 1.6x and r2plus1d_18 1.8x the eager module; VGG-16, without batch norms, gains
nothing, so featpipe's VGG-16 stays eager (its input is channels-last, which gains 1.2x).
"""

from __future__ import annotations

import logging
import warnings

from featpipe.backend import available_cores
from featpipe.settings import threads_setting

log = logging.getLogger(__name__)

#: cores per decoding worker from which a worker gets a core of its own (:func:`model_threads`)
CORES_PER_RESERVED_WORKER = 8
#: a frozen graph is used when it gives the module's output on a probe input within this
#: fraction of the output's largest value (a structural check: float32 rounding is ~1e-7)
FROZEN_TOLERANCE = 1e-4


def model_threads(jobs: int, cores: int | None = None) -> int:
    """torch threads for a network on the CPU beside ``jobs`` decoding workers:
    ``FEATPIPE_THREADS`` when set, else ``cores - min(jobs, cores // 8)`` (at least 1), with
    ``cores`` the cores this process may run on (module docstring)."""
    threads = threads_setting()
    if threads is not None:
        return threads
    cores = available_cores() if cores is None else int(cores)
    return max(1, cores - min(int(jobs), cores // CORES_PER_RESERVED_WORKER))


def frozen(module, example):
    """``module`` (eval mode, input batch -> tensor) as a frozen TorchScript graph for CPU
    inference, or ``module`` itself where that graph cannot be made or differs from it.

    The graph is traced on ``example`` (a batch of two inputs) and checked against the
    module on its first input alone (a trace that fixed the batch size or took another
    branch fails or differs there): its output within :data:`FROZEN_TOLERANCE` of the
    largest value."""
    import torch

    probe = example[:1]
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation and tracer warnings
            graph = torch.jit.trace(module, example, check_trace=False, strict=False)
            graph = torch.jit.optimize_for_inference(torch.jit.freeze(graph.eval()))
            expected, got = module(probe), graph(probe)
            scale = float(expected.abs().max())
            differs = tuple(got.shape) != tuple(expected.shape) or \
                float((got - expected).abs().max()) > FROZEN_TOLERANCE * max(scale, 1e-30)
    except Exception as err:  # noqa: BLE001 - any failure of tracing keeps the module
        log.debug("eager network: its frozen graph could not be made (%s: %s)",
                  type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
        return module
    if differs:
        log.debug("eager network: its frozen graph differs from it on a probe input")
        return module
    return graph
