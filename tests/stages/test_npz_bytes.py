"""The ``.npz`` files of a store (index tables, models, exports) are the same bytes on every
Python: :func:`featpipe.fileio.write_npz` gives each member's size before writing it, so no
member carries the ZIP64 fields that ``np.savez`` forces and that CPython 3.11.2 and 3.11.7
write differently (the golden store of ``test_store_format.py`` failed on Debian's 3.11.2)."""

from __future__ import annotations

import hashlib
import io
import zipfile

import numpy as np
import pytest

from featpipe.fileio import NPZ_MEMBER_TIME, atomic_save_npz

ARRAYS = {
    "keys": np.array([3, 1 << 63], dtype=np.uint64),
    "scalar": np.float64(np.nan),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "ids": np.array(["v00", "vidéo"]),
    "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    "half": np.linspace(-1, 1, 5, dtype=np.float16),
}

#: SHA-256 of the file :data:`ARRAYS` gives: written once, the same on any CPython 3.11.
EXPECTED_SHA256 = "86537d03b7fb5cc859281d32f7d3a088ca894b51a48fe64f12000f4f18f38314"


def _saved(tmp_path):
    path = tmp_path / "a.npz"
    checksum = atomic_save_npz(path, ARRAYS, checksum=True)
    return path, checksum


def test_np_load_reads_back_every_array_with_its_shape_dtype_and_values(tmp_path):
    path, _ = _saved(tmp_path)
    with np.load(path, allow_pickle=False) as loaded:
        assert loaded.files == list(ARRAYS)
        for key, value in ARRAYS.items():
            value = np.asarray(value)
            assert loaded[key].shape == value.shape, key
            assert loaded[key].dtype == value.dtype, key
            np.testing.assert_array_equal(loaded[key], value)


def test_each_member_holds_what_np_save_writes_in_c_order_stored_without_zip64_or_a_clock(tmp_path):
    path, _ = _saved(tmp_path)
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        assert [m.filename for m in members] == [f"{key}.npy" for key in ARRAYS]
        for member, value in zip(members, ARRAYS.values(), strict=True):
            expected = io.BytesIO()
            np.save(expected, np.asarray(value, order="C"), allow_pickle=False)
            assert archive.read(member) == expected.getvalue(), member.filename
            assert member.compress_type == zipfile.ZIP_STORED
            assert member.date_time == NPZ_MEMBER_TIME
            assert member.extra == b"", member.filename  # no ZIP64 field


def test_the_file_is_the_same_bytes_as_written_once_and_its_checksum_is_of_those(tmp_path):
    from featpipe.checksums import stream_checksum
    path, checksum = _saved(tmp_path)
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == EXPECTED_SHA256
    assert checksum == stream_checksum(io.BytesIO(data))


def test_an_object_array_is_refused_by_name_and_nothing_is_written(tmp_path):
    path = tmp_path / "o.npz"
    with pytest.raises(ValueError, match="'labels' has dtype object"):
        atomic_save_npz(path, {"ok": np.arange(2), "labels": np.array([None, 1])})
    assert list(tmp_path.iterdir()) == []
