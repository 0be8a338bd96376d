"""MATLAB ``.mat`` files: numeric variables in, featpipe's export layout out.

Reading: v4/v5/v6/v7 files through ``scipy.io`` (``whosmat`` for the headers, ``loadmat``
for the data), v7.3 files (HDF5 with a 512-byte MATLAB header) through ``h5py``.  Every array
comes back **as MATLAB shows it**: MATLAB stores column-major, so h5py sees a v7.3 matrix of
size T x D as a (D, T) dataset; it is transposed back here, and v5 files already read as
(T, D).  Numeric classes only (double, single, integers, logical); cells, structs, chars,
sparse and complex matrices are refused with their name and class.

Writing (``featpipe export -o X.mat``): ``scipy.io.savemat`` (format 5, uncompressed: zlib made
it 15x slower than ``.npz``); lists of strings become cell arrays of char rows (MATLAB's
``cellstr``), so ids with trailing spaces or of different lengths survive the round trip;
object arrays of numeric arrays become cell arrays of matrices (one per item).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from featpipe.errors import FeatpipeError
from featpipe.fileio import check_h5_dataset, first_line

#: MATLAB numeric classes and the numpy dtypes they read as.
NUMERIC_CLASSES = {"double": "float64", "single": "float32", "int8": "int8", "uint8": "uint8",
                   "int16": "int16", "uint16": "uint16", "int32": "int32", "uint32": "uint32",
                   "int64": "int64", "uint64": "uint64", "logical": "bool"}
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_]")


def matlab_name(text: str) -> str:
    """The MATLAB variable name a string maps to: characters outside [A-Za-z0-9_] become _."""
    return _NOT_A_NAME.sub("_", text)


def is_v73(path: str | os.PathLike) -> bool:
    import h5py

    return h5py.is_hdf5(str(path))


def variables(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape as MATLAB shows it, MATLAB class) of every variable, without the data."""
    path = Path(path)
    try:
        if is_v73(path):
            import h5py

            with h5py.File(path, "r") as handle:
                return {name: _h5_header(node) for name, node in handle.items()
                        if not name.startswith("#")}
        from scipy.io import whosmat

        return {name: (tuple(int(n) for n in shape), cls) for name, shape, cls in whosmat(path)}
    except (OSError, ValueError, TypeError, NotImplementedError) as err:
        raise FeatpipeError(f"{path}: not a readable MATLAB file ({first_line(err)})") from None


def _h5_header(node) -> tuple[tuple[int, ...], str]:
    import h5py

    if not isinstance(node, h5py.Dataset):
        cls = node.attrs.get("MATLAB_class", b"struct")
        return (), cls.decode() if isinstance(cls, bytes) else str(cls)
    cls = node.attrs.get("MATLAB_class", b"")
    cls = cls.decode() if isinstance(cls, bytes) else str(cls)
    if node.attrs.get("MATLAB_empty", 0):
        return (0,), cls
    return tuple(int(n) for n in reversed(node.shape)), cls


def read_variable(path: str | os.PathLike, name: str) -> np.ndarray:
    """One numeric variable, as MATLAB shows it (see the module docstring)."""
    path = Path(path)
    header = variables(path).get(name)
    if header is None:
        raise FeatpipeError(f"{path} has no variable {name!r}")
    shape, cls = header
    if cls not in NUMERIC_CLASSES:
        raise FeatpipeError(f"variable {name!r} of {path} is a MATLAB {cls or 'non-numeric'} "
                            "array; featpipe reads numeric matrices")
    if 0 in shape:
        return np.zeros(shape, dtype=np.float64)
    try:
        if is_v73(path):
            import h5py

            with h5py.File(path, "r") as handle:
                node = handle[name]
                if node.dtype.kind not in "biuf":
                    raise FeatpipeError(f"variable {name!r} of {path} is not a real numeric "
                                        f"array (stored as {node.dtype})")
                check_h5_dataset(node, name)  # a huge declared shape: before allocating
                array = np.asarray(node[()]).T
        else:
            from scipy.io import loadmat

            array = loadmat(path, variable_names=[name])[name]
    except (OSError, ValueError, TypeError, NotImplementedError) as err:
        raise FeatpipeError(f"cannot read variable {name!r} of {path}: {first_line(err)}") \
            from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        raise FeatpipeError(f"variable {name!r} of {path} is not a real numeric array "
                            f"({type(array).__name__} {getattr(array, 'dtype', '')})")
    return np.ascontiguousarray(array)


def numeric_variables(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Name -> (shape, dtype) of the numeric variables of a file (a header, as ``.npy``)."""
    return {name: (shape, np.dtype(NUMERIC_CLASSES[cls]))
            for name, (shape, cls) in variables(path).items() if cls in NUMERIC_CLASSES}


#: Rows copied at a time by :func:`fortran_order` (8 was the fastest of 8..64 measured).
FORTRAN_BLOCK = 8


def fortran_order(array: np.ndarray, block: int = FORTRAN_BLOCK) -> np.ndarray:
    """``array`` in column-major (MATLAB's) order, copied ``block`` rows at a time: each
    column's ``block`` values are then written together, 4x faster than numpy's own
    ``tobytes(order='F')`` on a (500, 60, 256) float32 array, which savemat would do."""
    if array.ndim < 2 or array.flags.f_contiguous:
        return array
    out = np.empty(array.shape, array.dtype, order="F")
    for start in range(0, array.shape[0], block):
        out[start:start + block] = array[start:start + block]
    return out


def save(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` as a v5 ``.mat`` file; string arrays and object arrays (of numeric
    arrays) become cell arrays."""
    from scipy.io import savemat

    variables_out = {}
    for name, value in arrays.items():
        value = np.asarray(value)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,62}", name):
            raise FeatpipeError(f"{name!r} is not a MATLAB variable name")
        if value.dtype.kind == "U":
            cells = np.empty(value.shape, dtype=object)
            for index, text in np.ndenumerate(value):
                cells[index] = str(text)
            value = cells if value.ndim else str(value)
        elif value.dtype.kind in "biuf":
            value = fortran_order(value)
        variables_out[name] = value
    try:
        savemat(path, variables_out, do_compression=False, oned_as="column")
    except (ValueError, OverflowError) as err:
        raise FeatpipeError(f"cannot write {path} as a MATLAB v5 file ({first_line(err)}); "
                            "a variable over 2 GiB needs -o FILE.h5") from None


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a file written by :func:`save` back: cells of strings become string arrays,
    cells of matrices stay object arrays of numeric arrays."""
    from scipy.io import loadmat

    out = {}
    for name, value in loadmat(path).items():
        if name.startswith("__"):
            continue
        numeric_cells = value.dtype == object and any(
            np.asarray(cell).dtype.kind in "biuf" for cell in value.ravel())
        if value.dtype == object and not numeric_cells:
            value = np.array([_cell_text(cell) for cell in value.ravel()],
                             dtype=str).reshape(value.shape)
        elif value.dtype.kind == "U":
            value = np.array(str(value[0]) if value.size else "")
        out[name] = value
    return out


def _cell_text(cell) -> str:
    cell = np.asarray(cell)
    return str(cell.ravel()[0]) if cell.size else ""
