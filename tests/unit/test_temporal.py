"""Temporal encoders against slow, obviously-correct references built from liblinear calls."""

from __future__ import annotations

import array_api_strict
import numpy as np
import pytest
import torch

from featpipe.encode.functional.temporal import arp_coefficients
from featpipe.encode.svr import rank_svr_liblinear
from featpipe.encode.temporal import (
    ApproximateRankPooling,
    AveragePooling,
    HierarchicalRankPooling,
    MaxPooling,
    RankPooling,
    RecursiveRankPooling,
    TemporalPyramid,
)
from featpipe.errors import FeatpipeError, InputError
from tests.unit.test_maps import literal_l2, literal_ser

# ---------------------------------------------------------------------------------------------
# the slow reference: loops, the literal maps, one liblinear -s 11 -e 1e-8 call per window


def ref_psi(x, psi):
    return {"none": x, "ssr": np.sign(x) * np.sqrt(np.abs(x)), "ser": literal_ser(x)}[psi]


def ref_rank_pool(X, psi, C=1.0, epsilon=0.1):
    X = np.asarray(X, dtype=np.float64)
    V = np.stack([literal_l2(ref_psi(X[: t + 1].mean(axis=0), psi)) for t in range(len(X))])
    return rank_svr_liblinear(V[None], C, epsilon, tol=1e-8)[0]


def ref_rank_pool_directions(X, directions, psi, C=1.0, epsilon=0.1):
    parts = {"fwd": [X], "rev": [X[::-1]], "both": [X, X[::-1]]}[directions]
    return np.concatenate([ref_rank_pool(P, psi, C, epsilon) for P in parts])


def ref_hrp_layer(X, window, stride, psi, C, epsilon):
    M = min(window, len(X))
    return np.stack([ref_rank_pool(X[s: s + M], psi, C, epsilon)
                     for s in range(0, len(X) - M + 1, stride)])


def ref_hrp(X, window, stride, depth, psi, C=1.0, epsilon=0.1):
    for _ in range(depth - 1):
        X = ref_hrp_layer(X, window, stride, psi, C, epsilon)
    return ref_rank_pool(X, psi, C, epsilon)


def ref_recursive_layer(X, psi, C, epsilon):
    ends = range(2, len(X) + 1) if len(X) > 1 else [1]
    return np.stack([ref_rank_pool(X[:t], psi, C, epsilon) for t in ends])


def ref_recursive(X, depth, psi, C=1.0, epsilon=0.1):
    for _ in range(depth - 1):
        X = ref_recursive_layer(X, psi, C, epsilon)
    return ref_rank_pool(X, psi, C, epsilon)


def assert_close_vectors(ours, ref):
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape
    cos = np.sum(ours * ref, -1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(ref, axis=-1))
    assert np.all(cos >= 0.99999), cos
    np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())


def sequences(lengths, dim=5, seed=0):
    rng = np.random.default_rng(seed)
    return [np.cumsum(rng.standard_normal((n, dim)), axis=0) * 0.3 for n in lengths]


# ---------------------------------------------------------------------------------------------
# order-blind baselines and ARP


def test_avg_max_tpyramid():
    seqs = sequences([1, 6, 9])
    np.testing.assert_allclose(AveragePooling().transform(seqs), [s.mean(0) for s in seqs])
    np.testing.assert_allclose(MaxPooling().transform(seqs), [s.max(0) for s in seqs])
    pyr = TemporalPyramid(pool="max").transform(seqs)
    X = seqs[2]  # T = 9: halves [0:4] and [4:9]
    np.testing.assert_allclose(pyr[2], np.concatenate([X.max(0), X[:4].max(0), X[4:].max(0)]))
    np.testing.assert_allclose(TemporalPyramid().transform(seqs)[0],
                               np.tile(seqs[0][0], 3))  # length 1: every cell is the frame


def test_arp_coefficients_loop_definition_and_sum_zero():
    for T in (1, 2, 3, 7, 50):
        H = [0.0]
        for i in range(1, T + 1):
            H.append(H[-1] + 1.0 / i)
        loop = [2.0 * (T - t + 1) - (T + 1) * (H[T] - H[t - 1]) for t in range(1, T + 1)]
        if T == 1:
            loop = [1.0]
        np.testing.assert_allclose(arp_coefficients(T), loop, rtol=1e-12)
        if T > 1:
            assert abs(arp_coefficients(T).sum()) < 1e-9 * T * T
            # Bilen et al.'s derivation: α_t = Σ_{i=t..T} (2i − T − 1)/i (ARP of the TVM)
            derived = [sum((2 * i - T - 1) / i for i in range(t, T + 1)) for t in range(1, T + 1)]
            np.testing.assert_allclose(arp_coefficients(T), derived, rtol=1e-9, atol=1e-9)


def test_arp_encoder():
    seqs = sequences([1, 8])
    out = ApproximateRankPooling().transform(seqs)
    np.testing.assert_allclose(out[1], arp_coefficients(8) @ seqs[1])
    np.testing.assert_allclose(out[0], seqs[0][0])


# ---------------------------------------------------------------------------------------------
# rank pooling, hierarchical and recursive against the liblinear reference


@pytest.mark.parametrize(("directions", "psi"), [("fwd", "ssr"), ("rev", "none"),
                                                ("both", "ssr"), ("both", "ser")])
def test_rankpool_matches_reference(directions, psi):
    seqs = sequences([1, 7, 12, 12, 25])  # mixed lengths: one padded batch
    ours = RankPooling(directions=directions, psi=psi).transform(seqs)
    for X, u in zip(seqs, ours, strict=True):
        assert_close_vectors(u, ref_rank_pool_directions(X, directions, psi))


def test_rankpool_liblinear_solver_path():
    seqs = sequences([10, 15])
    ours = RankPooling(solver="liblinear", psi="none", C=10.0, epsilon=0.0).transform(seqs)
    ref = [ref_rank_pool_directions(X, "both", "none", 10.0, 0.0) for X in seqs]
    for u, r in zip(ours, ref, strict=True):  # liblinear's default -e 0.001: close, not exact
        cos = u @ r / np.linalg.norm(u) / np.linalg.norm(r)
        assert cos > 0.999


@pytest.mark.parametrize(("window", "stride", "depth", "psi"),
                         [(8, 2, 2, "ser"), (5, 1, 3, "ssr"), (40, 1, 2, "ser")])
def test_hrp_matches_reference(window, stride, depth, psi):
    seqs = sequences([1, 6, 23], dim=4)
    ours = HierarchicalRankPooling(window=window, stride=stride, depth=depth, psi=psi,
                                   C=1.0).transform(seqs)
    for X, u in zip(seqs, ours, strict=True):
        assert_close_vectors(u, ref_hrp(X, window, stride, depth, psi))


def test_hrp_non_negative_features_match_reference():
    X = np.abs(sequences([15], dim=4, seed=9)[0])  # ReLU-like: the one-Gram SER shortcut
    u = HierarchicalRankPooling(window=6, stride=2).transform([X])[0]
    assert_close_vectors(u, ref_hrp(X, 6, 2, 2, "ser"))
    for psi in ("ser", "ssr"):
        u = RankPooling(psi=psi).transform([X])[0]
        assert_close_vectors(u, ref_rank_pool_directions(X, "both", psi))


def test_hrp_other_C_epsilon_and_emit_layer():
    X = sequences([17], dim=3)[0]
    u = HierarchicalRankPooling(window=6, stride=3, C=100.0, epsilon=1.0).transform([X])[0]
    assert_close_vectors(u, ref_hrp(X, 6, 3, 2, "ser", 100.0, 1.0))
    layer2 = HierarchicalRankPooling(window=6, stride=3, emit_layer=2).transform_sequences([X])
    assert_close_vectors(layer2[0], ref_hrp_layer(X, 6, 3, "ser", 1.0, 0.1))
    layer1 = HierarchicalRankPooling(emit_layer=1).transform_sequences([X])
    np.testing.assert_allclose(layer1[0], X)


def test_recursive_matches_reference():
    seqs = sequences([1, 2, 11], dim=4)
    ours = RecursiveRankPooling(depth=2, psi="ser").transform(seqs)
    for X, u in zip(seqs, ours, strict=True):
        assert_close_vectors(u, ref_recursive(X, 2, "ser"))
    layer2 = RecursiveRankPooling(emit_layer=2, chunk_bytes=2000).transform_sequences(seqs[2:])
    assert_close_vectors(layer2[0], ref_recursive_layer(seqs[2], "ser", 1.0, 0.1))


def test_hrp_streams_windows_in_chunks():
    X = sequences([120], dim=16, seed=3)[0].astype(np.float32)
    whole = HierarchicalRankPooling(window=10, chunk_bytes=2**30)
    tiny = HierarchicalRankPooling(window=10, chunk_bytes=1)  # one window per chunk
    np.testing.assert_allclose(tiny.transform([X]), whole.transform([X]), rtol=2e-4, atol=1e-6)
    a = HierarchicalRankPooling(window=10, chunk_bytes=30_000, emit_layer=2)
    b = HierarchicalRankPooling(window=10, chunk_bytes=2**30, emit_layer=2)
    np.testing.assert_allclose(a.transform_sequences([X])[0], b.transform_sequences([X])[0],
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("psi", ["ser", "ssr", "none"])
@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize(("dtype", "rtol"), [(np.float64, 1e-9), (np.float32, 2e-4)])
def test_compiled_window_passes_match_the_array_api_path(monkeypatch, psi, signed, dtype, rtol):
    """numpy windows go through the compiled pass (featpipe.encode._window_loop); the
    array-API path (running sums, ψ parts, batched Gram, the same solver) is the reference:
    odd and even window lengths, a stride, widths across several column blocks."""
    import featpipe.encode._window_loop as compiled
    import featpipe.encode.functional.temporal as module

    calls = []
    kernel = compiled.pool_windows
    monkeypatch.setattr(compiled, "pool_windows", lambda *a: calls.append(a[0]) or kernel(*a))
    rng = np.random.default_rng(31)
    for T, D, M, stride in [(40, 7, 5, 1), (61, 900, 20, 3), (30, 1203, 9, 2)]:
        X = np.cumsum(rng.standard_normal((T, D)), axis=0) / np.sqrt(T)
        X = (X if signed else np.maximum(X, 0)).astype(dtype)
        starts = module.window_starts(T, M, stride)
        ours = module.pool_windows(X, starts, M, stride, psi)
        reference = module.pool_windows(array_api_strict.asarray(X), starts, M, stride, psi)
        assert ours.dtype == dtype and ours.shape == reference.shape
        np.testing.assert_allclose(ours, np.asarray(reference), rtol=rtol,
                                   atol=rtol * float(np.abs(ours).max()))
        assert len(calls) == 1 and calls.pop() is X  # numpy took the compiled pass


@pytest.mark.parametrize("psi", ["ser", "ssr", "none"])
@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize(("dtype", "rtol"), [(np.float64, 1e-9), (np.float32, 2e-4)])
def test_compiled_sequence_passes_match_the_array_api_path(monkeypatch, psi, signed, dtype,
                                                           rtol):
    """Whole numpy sequences (rankpool, hrp's final layer) go through the compiled passes
    (featpipe.encode._window_loop.sequence_grams / sequence_pool); the array-API path is the
    reference: lengths that are not a multiple of the 4-row tiles, one row, several column
    blocks and 64-row panels, signed columns beside non-negative ones (SER skips the zero
    negative half of a block), each direction and both."""
    import featpipe.encode._window_loop as compiled
    import featpipe.encode.functional.temporal as module

    calls = []
    kernel = compiled.sequence_grams
    monkeypatch.setattr(compiled, "sequence_grams", lambda *a: calls.append(a[0]) or kernel(*a))
    rng = np.random.default_rng(32)
    for T, D in [(1, 5), (37, 7), (300, 900)]:
        X = np.cumsum(rng.standard_normal((T, D)), axis=0) / np.sqrt(T)
        X = (X if signed else np.maximum(X, 0)).astype(dtype)
        X[:, :D // 3] = np.abs(X[:, :D // 3])  # the first block(s): non-negative sums
        for directions in ("fwd", "rev", "both"):
            ours = module.rank_pool_windows(X[None], psi, directions=directions)
            reference = module.rank_pool_windows(array_api_strict.asarray(X[None]), psi,
                                                 directions=directions)
            assert ours.dtype == dtype and ours.shape == reference.shape
            np.testing.assert_allclose(ours, np.asarray(reference), rtol=rtol,
                                       atol=rtol * float(np.abs(ours).max()))
            assert len(calls) == 1 and np.shares_memory(calls.pop(), X)  # the compiled pass


def test_float32_in_float32_out():
    X = sequences([30], dim=8)[0].astype(np.float32)
    for enc in (RankPooling(), HierarchicalRankPooling(window=5), AveragePooling()):
        assert enc.transform([X]).dtype == np.float32


@pytest.mark.parametrize("to_array", [torch.from_numpy, array_api_strict.asarray],
                         ids=["torch", "array_api_strict"])
def test_namespaces_match_numpy(to_array):
    X = sequences([21], dim=4, seed=5)[0]
    for enc in (HierarchicalRankPooling(window=6, stride=2), RecursiveRankPooling(),
                RankPooling(), ApproximateRankPooling(), TemporalPyramid()):
        np.testing.assert_allclose(enc.transform([to_array(X)]), enc.transform([X]),
                                   rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# bad input


def test_bad_sequences_are_named():
    good = np.ones((5, 3))
    nan = good.copy()
    nan[2, 1] = np.nan
    with pytest.raises(InputError, match="sequence 1: contains NaN or Inf"):
        HierarchicalRankPooling().transform([good, nan])
    with pytest.raises(InputError, match="sequence 1: contains NaN or Inf"):
        RankPooling().transform([good, good * np.inf])
    with pytest.raises(InputError, match="sequence 2: has 4 features per frame, expected 3"):
        AveragePooling().transform([good, good, np.ones((5, 4))])
    with pytest.raises(InputError, match="sequence 0: expected a numeric"):
        RankPooling().transform([np.array([["a", "b"]])])
    with pytest.raises(InputError, match="sequence 1: empty sequence"):
        HierarchicalRankPooling().transform([good, np.ones((0, 3))])
    with pytest.raises(InputError, match="2-D"):
        MaxPooling().transform([np.ones(4)])
    with pytest.raises(InputError, match="at least one sequence"):
        MaxPooling().transform([])


@pytest.mark.parametrize(("params", "name"), [({"C": 0}, "C"), ({"C": -1.0}, "C"),
                                              ({"epsilon": -1}, "epsilon"),
                                              ({"window": 0}, "window"),
                                              ({"psi": "chi3"}, "psi"),
                                              ({"solver": "sgd"}, "solver"),
                                              ({"emit_layer": 3}, "emit_layer")])
def test_bad_parameters_are_named(params, name):
    with pytest.raises(InputError, match=name):
        HierarchicalRankPooling(**params).transform([np.ones((5, 3))])


def test_cuda_without_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(FeatpipeError, match="no GPU"):
        HierarchicalRankPooling(device="cuda").transform([np.ones((5, 3))])


def test_long_sequences_use_the_primal_solver(monkeypatch):
    import featpipe.encode.functional.temporal as temporal

    seqs = sequences([40, 13], dim=6, seed=7)
    dense_rank = RankPooling(psi="ser").transform(seqs)
    dense_hrp = HierarchicalRankPooling(window=5).transform(seqs)
    monkeypatch.setattr(temporal, "DENSE_MAX_LENGTH", 8)
    long_rank = RankPooling(psi="ser").transform(seqs)
    long_hrp = HierarchicalRankPooling(window=5, chunk_bytes=3000).transform(seqs)
    np.testing.assert_allclose(long_rank, dense_rank, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(long_hrp, dense_hrp, rtol=1e-7, atol=1e-9)
    strict = HierarchicalRankPooling(window=5).transform([array_api_strict.asarray(seqs[0])])
    np.testing.assert_allclose(strict[0], dense_hrp[0], rtol=1e-7, atol=1e-9)
    assert_close_vectors(long_rank[0], ref_rank_pool_directions(seqs[0], "both", "ser"))


@pytest.mark.parametrize("psi", ["ssr", "ser", "none"])
def test_a_long_sequence_keeps_its_running_sum_across_its_row_chunks(monkeypatch, psi):
    """A sequence longer than the dense solver's limit is rank pooled LONG_CHUNK_ROWS (128)
    rows at a time: the running sum of TVM goes on across the chunks, in both directions (a
    sum restarted at each chunk falls to cosine 0.43 past 128 rows).  Against the unchunked
    reference: v_t = L2(ψ(mean of rows 1..t)) of the whole sequence, liblinear -e 1e-8."""
    import featpipe.encode.functional.temporal as temporal

    monkeypatch.setattr(temporal, "DENSE_MAX_LENGTH", 64)
    X = sequences([3 * temporal.LONG_CHUNK_ROWS - 50], dim=6, seed=8)[0]
    assert X.shape[0] > 300
    u = RankPooling(psi=psi).transform([X])[0]
    assert_close_vectors(u, ref_rank_pool_directions(X, "both", psi))


@pytest.mark.parametrize("threads", ["2", "16"])
def test_hrp_long_sequence_peak_memory_is_a_small_multiple_of_the_input(monkeypatch, threads):
    import tracemalloc

    import featpipe.encode.functional.temporal as temporal

    # the budget is per process: 16 worker threads (a 16-core node) share it
    monkeypatch.setenv("FEATPIPE_THREADS", threads)
    monkeypatch.setattr(temporal, "DENSE_MAX_LENGTH", 256)
    rng = np.random.default_rng(8)
    X = np.abs(np.cumsum(rng.standard_normal((1500, 256)), axis=0)).astype(np.float32)
    encoder = HierarchicalRankPooling(chunk_bytes=2 * X.nbytes)
    encoder.transform([X[:300]])  # first-call imports and caches are not the encoder's memory
    tracemalloc.start()
    try:
        u = encoder.transform([X])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # all 1481 windows of 20 SER vectors at once would be 1481·20·512·4 B = 40x the input;
    # streamed: layer 2 (2x), the final layer's vectors at half size (2x) and chunk
    # temporaries (measured 4.7x)
    assert peak < 6 * X.nbytes, peak / X.nbytes
    assert u.shape == (1, 1024) and np.all(np.isfinite(u))


def test_ser_rows_represent_the_normalised_ser_vectors():
    from featpipe.encode.functional.temporal import SerRows
    from featpipe.encode.maps import normalized_map

    rng = np.random.default_rng(10)
    S = rng.standard_normal((7, 5))
    S[3] = 0.0
    V = normalized_map(S, "ser")
    rows = SerRows.from_smoothed(S)
    u, s = rng.standard_normal(10), rng.standard_normal(7)
    assert rows.shape == V.shape
    np.testing.assert_allclose(rows.matvec(u), V @ u, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rows.rmatvec(s), V.T @ s, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls, params", [
    (HierarchicalRankPooling, {"window": 6, "depth": 2, "psi": "ser"}),
    (HierarchicalRankPooling, {"window": 4, "depth": 3, "psi": "ser", "directions": "both"}),
    (HierarchicalRankPooling, {"window": 5, "depth": 2, "psi": "ssr"}),
    (RecursiveRankPooling, {"depth": 2, "psi": "ser", "directions": "both"}),
])
def test_zero_columns_left_out_of_later_layers_change_only_rounding(monkeypatch, cls, params):
    """Non-negative input (ReLU-like, with dead units): the numpy path drops each layer's
    all-zero columns (the zero half of SER) from the next; the array-API path keeps them."""
    import featpipe.encode.functional.temporal as module

    rng = np.random.default_rng(21)
    X = np.maximum(np.cumsum(rng.standard_normal((40, 12)), axis=0), 0).astype(np.float32)
    X[:, [2, 7]] = 0.0  # dead units
    widths = []
    final = module._Layers.final

    def recording(self, Y):
        widths.append(Y.shape[1])
        return final(self, Y)

    monkeypatch.setattr(module._Layers, "final", recording)
    compact = cls(**params).transform([X])[0]
    full = np.asarray(cls(**params).transform([array_api_strict.asarray(X)])[0])
    assert compact.shape == full.shape
    # float32 rounding of a different summation order, relative to the vector's scale
    np.testing.assert_allclose(compact, full, rtol=1e-5, atol=1e-6 * np.abs(full).max())
    assert np.all(compact[full == 0] == 0)
    # the numpy run gave its final layer fewer columns than the full width (the array-API
    # run is batched and never calls _final)
    layer_width = 12 * (2 ** (params["depth"] - 1) if params["psi"] == "ser" else 1)
    assert len(widths) == 1 and widths[0] < layer_width


def test_an_all_zero_sequence_still_encodes_to_the_full_width():
    X = np.zeros((30, 8), np.float32)
    u = HierarchicalRankPooling(window=5).transform([X])[0]
    v = HierarchicalRankPooling(window=5).transform([array_api_strict.asarray(X)])[0]
    assert u.shape == (32,) and not np.any(u)  # zero frames: v_t = 0, so u* = 0
    np.testing.assert_array_equal(u, np.asarray(v))


def test_a_long_final_layer_keeps_its_zero_columns(monkeypatch):
    """The primal solver of a long final layer gets the layer as it is (its float32 run time
    depends on rounding); the result equals the array-API path."""
    import featpipe.encode.functional.temporal as module

    monkeypatch.setattr(module, "DENSE_MAX_LENGTH", 16)
    rng = np.random.default_rng(22)
    X = np.maximum(np.cumsum(rng.standard_normal((40, 6)), axis=0), 0).astype(np.float32)
    widths = []
    final = module._Layers.final
    monkeypatch.setattr(module._Layers, "final",
                        lambda self, Y: widths.append(Y.shape[1]) or final(self, Y))
    u = HierarchicalRankPooling(window=5).transform([X])[0]
    v = np.asarray(HierarchicalRankPooling(window=5).transform([array_api_strict.asarray(X)])[0])
    assert widths == [12]
    assert_close_vectors(u, v)


@pytest.mark.parametrize("psi", ["ser", "ssr", "none"])
@pytest.mark.parametrize("directions", ["fwd", "both"])
def test_rank_pooling_of_a_sequence_does_not_depend_on_its_batch(psi, directions):
    """`featpipe encode` pools items in batches (64 a call for rankpool) while `extract --pool`
    pools each item alone: both must give the same bits (one key, one result), whatever the
    lengths and signs of the other items of a batch."""
    from featpipe.encode.functional.temporal import rank_pool_sequences

    rng = np.random.default_rng(7)
    seqs = [rng.standard_normal((T, 24)).astype(np.float32) for T in (37, 50, 37, 8, 50, 37, 1)]
    seqs[2] = np.abs(seqs[2])
    params = dict(directions=directions, psi=psi, C=1.0, epsilon=0.1, solver="newton",
                  device="cpu")
    together = rank_pool_sequences(seqs, batch_size=64, **params)
    for X, pooled in zip(seqs, together, strict=True):
        np.testing.assert_array_equal(rank_pool_sequences([X], batch_size=64, **params)[0],
                                      pooled)


def test_a_long_memory_mapped_sequence_is_rank_pooled_within_the_memory_budget(tmp_path,
                                                                              monkeypatch):
    """Issue 38 §1: a sequence longer than the dense solver's 2,048 frames, memory-mapped (as an
    extraction's pass spills a long video), is checked and rank pooled without a full-size
    copy in memory: the solver's vectors go to a memory-mapped file once bigger than the
    budget; the result equals the in-memory run's to the bit."""
    import tracemalloc

    from featpipe.encode.functional.temporal import (
        DENSE_MAX_LENGTH,
        LONG_CHUNK_ROWS,
        rank_pool_sequences,
    )

    T, D = 3 * DENSE_MAX_LENGTH, 600
    path = tmp_path / "x.npy"
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(T, D))
    X[...] = np.random.default_rng(0).standard_normal((T, D))
    X.flush()
    params = dict(directions="both", psi="ssr", C=1.0, epsilon=0.1, solver="newton",
                  device="cpu", batch_size=64)
    expected = rank_pool_sequences([np.array(X)], **params)[0]
    mapped = np.load(path, mmap_mode="r")
    monkeypatch.setenv("FEATPIPE_MEMORY", "1M")
    tracemalloc.start()
    got = rank_pool_sequences([mapped], **params)[0]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_array_equal(got, expected)
    # a fixed number of rows at a time (their float64 sums and maps), whatever the length:
    # here a quarter of the 14.7 MB sequence
    assert peak < 6 * 8 * LONG_CHUNK_ROWS * D < 0.3 * T * D * 4, peak
