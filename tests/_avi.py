"""MJPG AVI files written byte by byte (RIFF), with zero-length "drop" chunks where asked.

A drop chunk is an ``00dc`` chunk of size 0 listed in the ``idx1`` index: in a variable-rate
capture it means "the previous frame again".  The header declares every chunk as a frame
(``avih.dwTotalFrames``, ``strh.dwLength``), drops included, as capture software does.
Layout: Microsoft's AVI RIFF reference (``hdrl``: ``avih``, ``strl`` with ``strh`` and a
BITMAPINFOHEADER ``strf``; ``movi``; ``idx1`` with offsets from the ``movi`` fourcc).
"""

from __future__ import annotations

import struct

import cv2
import numpy as np

AVIIF_KEYFRAME = 0x10


def _chunk(fourcc: bytes, data: bytes) -> bytes:
    return fourcc + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")


def _list(kind: bytes, body: bytes) -> bytes:
    return b"LIST" + struct.pack("<I", len(body) + 4) + kind + body


def write_avi(path, frames: list[np.ndarray], fps: int, drops: set[int] = frozenset()) -> list:
    """Write RGB ``frames`` as MJPG at ``fps``; chunk positions in ``drops`` are zero-length
    chunks between them.  Returns the frames as the container defines them (a drop repeats
    the previous frame), decoded from the written JPEGs."""
    height, width = frames[0].shape[:2]
    jpegs = iter(cv2.imencode(".jpg", cv2.cvtColor(f, cv2.COLOR_RGB2BGR))[1].tobytes()
                 for f in frames)
    total = len(frames) + len(drops)
    movi, index, offset, defined, last = b"", b"", 4, [], None
    for position in range(total):
        data = b"" if position in drops else next(jpegs)
        if data:
            last = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR),
                                cv2.COLOR_BGR2RGB)
        defined.append(last)
        chunk = _chunk(b"00dc", data)
        index += b"00dc" + struct.pack("<III", AVIIF_KEYFRAME if data else 0, offset, len(data))
        movi += chunk
        offset += len(chunk)
    avih = struct.pack("<14I", 1_000_000 // fps, 0, 0, AVIIF_KEYFRAME, total, 0, 1, 0, width,
                       height, 0, 0, 0, 0)
    strh = b"vidsMJPG" + struct.pack("<IHHIIIIIIIIhhhh", 0, 0, 0, 0, 1, fps, 0, total, 0,
                                     0xFFFFFFFF, 0, 0, 0, width, height)
    strf = struct.pack("<IiiHH4sIiiII", 40, width, height, 1, 24, b"MJPG", width * height * 3,
                       0, 0, 0, 0)
    header = _list(b"hdrl", _chunk(b"avih", avih)
                   + _list(b"strl", _chunk(b"strh", strh) + _chunk(b"strf", strf)))
    body = b"AVI " + header + _list(b"movi", movi) + _chunk(b"idx1", index)
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return defined
