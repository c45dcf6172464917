"""The one place for every constant that crosses the sandbox boundary.

Both sides import this file: the parent as ``grader.child.protocol``, the child
by path. Standard library only.

Frames: the zygote talks to the parent over one pipe it alone holds (the task
processes close it before any submission code runs). Each frame is an 8-byte
header (JSON length, blob length; unsigned 32-bit, big-endian), then the JSON
object (UTF-8), then the blob (raw little-endian float64 outputs, or empty).
"""
from __future__ import annotations

import json
import os
import struct

# File names in the job folder (read-only inside the sandbox).
JOB_SPEC = "job.json"
JOB_DATA = "data.npy"
ZYGOTE = "zygote.py"
CHILD_FILES = ("protocol.py", "zygote.py", "tasks.py", "run_own_tests.py")

# The zygote gets two descriptors on its command line: it writes frames to the first and reads
# the parent's frames ({"go": true} before each task, {"secret": ...} when it asks, the reply to a
# relayed {"ev": "call"}) from the second.

# An own-tests process under a planted variant knows only that it is wrapped ("wrapped", or "none"
# for the submission as it is); each call of the wrapped code goes, as a frame, through the zygote
# to the parent, which alone knows the variant and answers with the call's outcome.
WRAPPED = "wrapped"
# Arrays that cross in a frame's blob: these dtypes only, little-endian, C order.
ARRAY_DTYPES = ("<f2", "<f4", "<f8", "<i4", "<i8", "|b1")

# Bounds on what the parent reads: a frame past them ends the session as malformed.
JSON_LIMIT = 2 * 2**20  # bytes of one frame's JSON
BLOB_LIMIT = 64 * 2**20  # bytes of one frame's blob (float64 outputs)
ANSWER_LIMIT = JSON_LIMIT + BLOB_LIMIT + 8  # what the zygote accepts from one task process
TEXT_LIMIT = 300  # characters kept of any string a task reports

# Exit codes of the zygote (the task processes' own codes are reported per task).
EXIT_OK = 0
EXIT_PARENT_GONE = 90  # the parent's pipe closed: nothing to do but stop
EXIT_BAD_JOB = 91  # the job files could not be read

_HEADER = struct.Struct(">II")


def encode(obj: dict, blob: bytes = b"") -> bytes:
    """One frame: header, JSON, blob."""
    data = json.dumps(obj, allow_nan=False).encode()
    return _HEADER.pack(len(data), len(blob)) + data + blob


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def decode(buffer: bytes, json_limit: int = JSON_LIMIT, blob_limit: int = BLOB_LIMIT):
    """``(obj, blob, rest)`` for the first frame of ``buffer``, or ``(None, b"", buffer)`` when incomplete.

    Raises:
        ValueError: a header past the limits, JSON that is not an object or is nested too deep.
    """
    if len(buffer) < _HEADER.size:
        return None, b"", buffer
    n_json, n_blob = _HEADER.unpack_from(buffer)
    if n_json > json_limit or n_blob > blob_limit:
        raise ValueError(f"a frame of {n_json} + {n_blob} bytes, over the limits {json_limit} + {blob_limit}")
    end = _HEADER.size + n_json + n_blob
    if len(buffer) < end:
        return None, b"", buffer
    try:
        obj = json.loads(bytes(buffer[_HEADER.size:_HEADER.size + n_json]))
    except RecursionError:  # nesting deeper than this reader's stack: malformed, whoever reads it
        raise ValueError("a frame whose JSON is nested too deep") from None
    if not isinstance(obj, dict):
        raise ValueError("a frame whose JSON is not an object")
    return obj, bytes(buffer[_HEADER.size + n_json:end]), memoryview(buffer)[end:]


def pack_arrays(arrays: dict) -> tuple[list, bytes]:
    """``(meta, blob)`` for named arrays (NumPy arrays of ``ARRAY_DTYPES``, already contiguous):
    ``meta`` is ``[[name, dtype, shape], ...]`` in blob order, for a frame's JSON."""
    meta, parts = [], []
    for name, array in arrays.items():
        meta.append([name, array.dtype.str, list(array.shape)])
        parts.append(array.tobytes())
    return meta, b"".join(parts)


def unpack_arrays(meta, blob: bytes, frombuffer) -> dict:
    """The arrays of :func:`pack_arrays`, rebuilt with ``frombuffer`` (``numpy.frombuffer``; read-only views).

    Raises:
        ValueError: meta that is not a list of ``[name, dtype, shape]`` with a dtype of ``ARRAY_DTYPES``,
            or sizes that do not add up to the blob's length.
    """
    if not isinstance(meta, list) or len(meta) > 16:
        raise ValueError("array meta must be a list of at most 16 [name, dtype, shape]")
    out, offset = {}, 0
    for item in meta:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and item[1] in ARRAY_DTYPES
                and isinstance(item[2], list) and len(item[2]) <= 8
                and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in item[2])):
            raise ValueError(f"bad array meta {str(item)[:80]}")
        name, dtype, shape = item
        count = 1
        for n in shape:
            count *= n
        size = count * int(dtype[2:])
        if offset + size > len(blob):
            raise ValueError(f"array {name[:40]!r} runs past the blob ({offset + size} > {len(blob)} bytes)")
        out[name] = frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += size
    if offset != len(blob):
        raise ValueError(f"{len(blob) - offset} bytes of the blob belong to no array")
    return out
