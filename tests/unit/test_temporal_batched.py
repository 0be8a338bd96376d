"""The batched rank-pooling path (torch / CuPy / array_api_strict): same optimum as the numpy
path and the liblinear reference, a number of device operations that does not grow with the
number of items, gradients through the argmin, and memory bounded per process."""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest
import torch

import featpipe.encode.functional.temporal as temporal
from featpipe.encode.functional.temporal import (
    layer_rows,
    rank_pool_batch,
    rank_pool_long,
    rank_pool_rows,
    sequence_rows,
)
from featpipe.encode.svr import rank_svr, rank_svr_dual, rank_svr_primal
from featpipe.encode.temporal import HierarchicalRankPooling, RankPooling, RecursiveRankPooling
from featpipe.errors import InputError
from tests.unit.test_temporal import (
    assert_close_vectors,
    ref_hrp,
    ref_hrp_layer,
    ref_rank_pool_directions,
    sequences,
)

TO_ARRAY = {"torch": torch.from_numpy, "array_api_strict": array_api_strict.asarray}


@pytest.fixture
def batched_calls(monkeypatch):
    """Counts calls of rank_pool_rows, to prove that the batched path ran."""
    calls = []
    original = temporal.rank_pool_rows

    def spy(X, rows, *args, **kwargs):
        calls.append(rows.shape)
        return original(X, rows, *args, **kwargs)

    monkeypatch.setattr(temporal, "rank_pool_rows", spy)
    return calls


def test_layer_and_sequence_rows():
    rows, window_lengths, count = layer_rows([7, 2, 5], window=3, stride=2)
    # item 0 (rows 0..6): windows at 0, 2, 4; item 1 (rows 7, 8) shorter than the window: one
    # window of 2 (its last row repeated as padding); item 2 (rows 9..13): windows at 9, 11
    np.testing.assert_array_equal(rows, [[0, 1, 2], [2, 3, 4], [4, 5, 6], [7, 8, 8],
                                         [9, 10, 11], [11, 12, 13]])
    np.testing.assert_array_equal(window_lengths, [3, 3, 3, 2, 3, 3])
    np.testing.assert_array_equal(count, [3, 1, 2])
    np.testing.assert_array_equal(sequence_rows([3, 1]), [[0, 1, 2], [3, 3, 3]])
    np.testing.assert_array_equal(sequence_rows([3, 1], reverse=True), [[2, 1, 0], [3, 3, 3]])
    np.testing.assert_array_equal(sequence_rows([2], offsets=[5]), [[5, 6]])


@pytest.mark.parametrize("namespace", sorted(TO_ARRAY))
@pytest.mark.parametrize("chunk_bytes", [2**28, 3000, 1], ids=["one-chunk", "chunks", "tiny"])
def test_batched_hrp_matches_the_numpy_path_and_liblinear(namespace, chunk_bytes,
                                                          batched_calls):
    seqs = sequences([1, 3, 7, 12, 25, 6], dim=4, seed=11)
    to_array = TO_ARRAY[namespace]
    for params in ({"window": 5, "stride": 2}, {"window": 4, "depth": 3, "psi": "ssr"},
                   {"window": 6, "psi": "none", "directions": "both"}):
        encoder = HierarchicalRankPooling(chunk_bytes=chunk_bytes, **params)
        numpy_out = encoder.transform(seqs)
        calls = len(batched_calls)
        ours = encoder.transform([to_array(X) for X in seqs])
        assert len(batched_calls) > calls  # the batched path ran
        np.testing.assert_allclose(ours, numpy_out, rtol=1e-9, atol=1e-12)
    for X, u in zip(seqs, ours, strict=True):
        assert_close_vectors(u, ref_rank_pool_directions(ref_hrp_layer(X, 6, 1, "none", 1.0,
                                                                       0.1), "both", "none"))


def test_batched_hrp_on_non_negative_features_and_emitted_layers():
    seqs = [np.abs(X) for X in sequences([15, 4, 9], dim=4, seed=9)]
    tensors = [torch.from_numpy(X) for X in seqs]
    ours = HierarchicalRankPooling(window=6, stride=2).transform(tensors)
    for X, u in zip(seqs, ours, strict=True):
        assert_close_vectors(u, ref_hrp(X, 6, 2, 2, "ser"))
    emitted = HierarchicalRankPooling(window=6, stride=2, emit_layer=2).transform_sequences(
        tensors)
    for X, layer in zip(seqs, emitted, strict=True):
        assert_close_vectors(layer, ref_hrp_layer(X, 6, 2, "ser", 1.0, 0.1))


@pytest.mark.parametrize("namespace", sorted(TO_ARRAY))
def test_batched_rankpool_and_recursive_match_numpy(namespace, batched_calls):
    seqs = sequences([1, 7, 12, 12, 25, 40], dim=5, seed=2)
    to_array = TO_ARRAY[namespace]
    for encoder in (RankPooling(), RankPooling(psi="ser", directions="rev"),
                    RecursiveRankPooling()):
        np.testing.assert_allclose(encoder.transform([to_array(X) for X in seqs]),
                                   encoder.transform(seqs), rtol=1e-9, atol=1e-12)
    assert batched_calls
    ours = RankPooling(psi="ser").transform([to_array(X) for X in seqs])
    for X, u in zip(seqs, ours, strict=True):
        assert_close_vectors(u, ref_rank_pool_directions(X, "both", "ser"))


def test_batched_path_with_long_final_layers(monkeypatch):
    monkeypatch.setattr(temporal, "DENSE_MAX_LENGTH", 8)
    seqs = sequences([40, 13, 6], dim=6, seed=7)
    numpy_out = HierarchicalRankPooling(window=5).transform(seqs)
    ours = HierarchicalRankPooling(window=5).transform([torch.from_numpy(X) for X in seqs])
    np.testing.assert_allclose(ours, numpy_out, rtol=1e-7, atol=1e-9)


def _aten_calls(fn):
    """Operator calls made from Python (top-level aten ops): kernel launches on a GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    return sum(1 for e in events
               if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))


def test_device_operations_do_not_grow_with_the_number_of_items():
    rng = np.random.default_rng(3)
    seqs = [torch.from_numpy(np.abs(np.cumsum(rng.standard_normal((60, 32)), axis=0)))
            for _ in range(32)]
    for encoder in (HierarchicalRankPooling(), RankPooling()):
        encoder.transform(seqs[:2])
        few = _aten_calls(lambda encoder=encoder: encoder.transform(seqs[:4]))
        many = _aten_calls(lambda encoder=encoder: encoder.transform(seqs))
        # 8x the items: the same batched operations (a few more Newton steps at most) plus
        # the input checks of each item (isfinite, all); the per-item path made ~2,000 calls
        # per item of this size
        assert many < 1.5 * few, (type(encoder).__name__, few, many)
        assert (many - few) / (len(seqs) - 4) < 10, (type(encoder).__name__, few, many)


def test_rows_are_pooled_in_original_order():
    rng = np.random.default_rng(4)
    X = torch.from_numpy(np.cumsum(rng.standard_normal((30, 3)), axis=0))
    lengths = np.array([9, 3, 9, 5])
    rows = np.stack([np.minimum(np.arange(9), n - 1) + o for n, o in
                     zip(lengths, [0, 10, 15, 20], strict=True)])
    U = rank_pool_rows(X, rows, lengths, psi="ssr", chunk_bytes=1)
    for w, (n, o) in enumerate(zip(lengths, [0, 10, 15, 20], strict=True)):
        alone = rank_pool_rows(X, rows[w:w + 1, :n], lengths[w:w + 1], psi="ssr")
        np.testing.assert_allclose(U[w].numpy(), alone[0].numpy(), rtol=1e-10, atol=1e-12)
        assert_close_vectors(U[w].numpy(), ref_rank_pool_directions(
            X[o:o + n].numpy(), "fwd", "ssr"))


def test_torch_cpu_solve_of_windows_longer_than_256():
    # torch's batched CPU LU solve fails with two threads for n > 256 (MKL "DLASWP");
    # the SVR uses a Cholesky solve
    rng = np.random.default_rng(5)
    V = rng.standard_normal((2, 300, 40))
    V /= np.linalg.norm(V, axis=-1, keepdims=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        U = rank_svr(torch.from_numpy(V))
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(U.numpy(), rank_svr(V), rtol=1e-8, atol=1e-10)


# -- gradients --------------------------------------------------------------------------------

def test_gradcheck_rank_svr():
    rng = np.random.default_rng(6)
    V = torch.tensor(rng.standard_normal((2, 6, 4)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda V: rank_svr(V, C=2.0, epsilon=0.1), (V,))
    assert torch.autograd.gradcheck(lambda V: rank_svr(V, lengths=[6, 4]), (V,))


def test_gradcheck_batched_hrp_and_rank_pooling():
    rng = np.random.default_rng(7)
    X = torch.tensor(np.abs(np.cumsum(rng.standard_normal((11, 3)), axis=0)) + 0.5,
                     requires_grad=True)

    def hrp(X):
        rows, window_lengths, count = layer_rows([7, 4], window=4, stride=2)
        layer = rank_pool_rows(X, rows, window_lengths, psi="ser")
        return rank_pool_batch(layer, count, psi="ssr", directions="both")

    assert torch.autograd.gradcheck(hrp, (X,))
    assert torch.autograd.gradcheck(
        lambda X: rank_pool_batch(X, [5, 6], psi="ser", directions="fwd"), (X,))


def test_gradcheck_rank_svr_dual_on_symmetric_gram():
    rng = np.random.default_rng(8)
    V = rng.standard_normal((1, 5, 3))
    V /= np.linalg.norm(V, axis=-1, keepdims=True)
    G = torch.tensor(V @ V.transpose(0, 2, 1), requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda G: rank_svr_dual(0.5 * (G + G.transpose(1, 2)))[0], (G,))


def test_non_differentiable_solvers_refuse_tensors_that_require_grad():
    X = torch.ones((6, 3), dtype=torch.float64, requires_grad=True)
    with pytest.raises(InputError, match="rank_svr_primal.*not differentiable"):
        rank_svr_primal([X], 1.0, 0.1)
    with pytest.raises(InputError, match="not differentiable"):
        rank_pool_long(X)
    rank_svr_primal([X.detach()], 1.0, 0.1)  # detached: fine


# -- memory -----------------------------------------------------------------------------------

def test_hrp_memory_budget_is_split_among_threads(monkeypatch):
    """The per-process budget is shared by the worker threads: FEATPIPE_THREADS=16 runs 16
    chunks at a time, each 1/16 of the budget."""
    import featpipe.encode.functional.temporal as module

    started = []
    original = module.ThreadPoolExecutor

    class Recording(original):
        def __init__(self, workers):
            started.append(workers)
            super().__init__(workers)

    monkeypatch.setattr(module, "ThreadPoolExecutor", Recording)
    monkeypatch.setenv("FEATPIPE_THREADS", "16")
    X = np.abs(sequences([200], dim=64, seed=1)[0]).astype(np.float32)
    budget = 16 * 8 * module.window_bytes(20, 64, 4)  # 8 windows per thread
    sizes = []
    original_pool = module.pool_windows

    def recording_pool(X, starts, *args, **kwargs):
        sizes.append(len(starts))
        return original_pool(X, starts, *args, **kwargs)

    monkeypatch.setattr(module, "pool_windows", recording_pool)
    out = module.hrp_layer(X, chunk_bytes=budget)
    assert started == [16] and max(sizes) == 8 and sum(sizes) == out.shape[0] == 181
    # the same budget from the environment (what a job script sets), via the estimator
    sizes.clear()
    monkeypatch.setenv("FEATPIPE_MEMORY", str(budget))
    layer = HierarchicalRankPooling(emit_layer=2).transform_sequences([X])[0]
    assert max(sizes) == 8 and sum(sizes) == 181
    np.testing.assert_array_equal(layer, out)
    monkeypatch.setenv("FEATPIPE_MEMORY", "2G")
    sizes.clear()
    module.hrp_layer(X)
    assert max(sizes) == 181  # one chunk per thread at most; 2 GiB holds every window
    monkeypatch.setenv("FEATPIPE_THREADS", "0")
    with pytest.raises(Exception, match="FEATPIPE_THREADS"):
        module.hrp_layer(X)


@pytest.mark.parametrize("value, expected", [("268435456", 2**28), ("512M", 2**29),
                                             ("512MiB", 2**29), ("1.5g", 3 * 2**29),
                                             ("64k", 2**16), (" 4G ", 2**32)])
def test_memory_budget_reads_sizes_with_binary_units(monkeypatch, value, expected):
    from featpipe.backend import memory_budget

    monkeypatch.setenv("FEATPIPE_MEMORY", value)
    assert memory_budget() == expected
    assert memory_budget(1000) == 1000  # an explicit chunk_bytes wins


@pytest.mark.parametrize("value", ["0", "lots", "-1G", "0.5", "G", "inf", "nan"])
def test_a_bad_memory_budget_names_the_variable(monkeypatch, value):
    from featpipe.backend import memory_budget
    from featpipe.errors import FeatpipeError

    monkeypatch.setenv("FEATPIPE_MEMORY", value)
    with pytest.raises(FeatpipeError, match=f"FEATPIPE_MEMORY must be a size .*got {value!r}"):
        memory_budget()


def test_encode_batches_items_on_the_device():
    from featpipe.encode.registry import load_methods

    methods = load_methods()
    for name, cpu, cuda in (("hrp", 1, 32), ("recursive", 1, 32), ("rankpool", 64, 256)):
        size = methods[name].batch_size
        assert size({"device": "cpu"}) == cpu and size({"device": "cuda"}) == cuda


def test_gradcheck_maps_and_pooling_functions():
    from featpipe.encode import maps
    from featpipe.encode.svr import rank_svr_unit

    rng = np.random.default_rng(9)
    X = torch.tensor(rng.uniform(0.5, 2.0, (7, 3)) * rng.choice([-1, 1], (7, 3)),
                     requires_grad=True)
    functions = [maps.running_sum, maps.time_varying_mean, maps.signed_square_root,
                 maps.sign_expansion_root, maps.l2_normalize,
                 lambda X: maps.rank_pool_vectors(X, "ser"),
                 temporal.average_pool, temporal.max_pool, temporal.temporal_pyramid,
                 temporal.approximate_rank_pool,
                 lambda X: temporal.rank_pool_windows(X[None], "ssr", directions="both"),
                 lambda X: temporal.recursive_layer(X, "ser"),
                 lambda X: rank_svr_unit(X[None], C=3.0)]
    for fn in functions:
        assert torch.autograd.gradcheck(fn, (X,)), fn


def test_liblinear_solver_refuses_tensors_that_require_grad():
    X = torch.tensor(sequences([8], dim=3)[0], requires_grad=True)
    for fn in (lambda: temporal.rank_pool_windows(X[None], "ssr", solver="liblinear"),
               lambda: temporal.recursive_layer(X, "ssr", solver="liblinear"),
               lambda: temporal.rank_svr_liblinear(X[None])):
        with pytest.raises(InputError, match="not differentiable"):
            fn()
