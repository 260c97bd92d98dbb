"""Plumbing (hand-written): the frames of the processes engine's pipes — its wire format.

A frame is an 8-byte length and a body whose first byte says how to read the rest: a raw
array (with the small-message path's cached heads, `_HEADS` and `_FORMATS`), a reference to
a shared-memory segment, an acknowledgement, or a pickle. Also `portable`, which makes an
exception fit to travel pickled. The module docstring of `dsml.comm.processes` describes the
whole engine.
"""
from __future__ import annotations

import pickle
import struct

import numpy as np

from dsml.comm.driver import RemoteFailure
from dsml.comm.segments import SHM_THRESHOLD, ShmRef

_FRAME = struct.Struct("<Q")

_ACK = -2      # frame tag: "I am done with the arrays in these segments of yours" (names)
_BYE = -4      # frame tag: "my program has returned" (failures="notify": end of file is death)

# A frame is its length (8 bytes) and a body whose first byte says how to read the rest:
_PICKLED = 0   # pickle of (tag, payload): structured messages, anything unusual
_RAW = 1       # a bare array: tag, ndim, dtype code, shape, then its bytes as they are in memory
_REF = 2       # a bare array in shared memory: tag, ndim, dtype code, segment name, shape
_NAMES = 3     # an acknowledgement: the names of the segments, one a line
_PICKLED_HEAD = struct.Struct("<QB")
_TAG = struct.Struct("<q")
_RAW_HEAD = struct.Struct("<QBqBB")   # frame length, kind, tag, ndim, length of the dtype code
_REF_HEAD = struct.Struct("<QBqBBB")  # ... and the length of the segment's name
_DIMS = [struct.Struct(f"<{ndim}q") for ndim in range(64 + 1)]
_BIG_TAG = 1 << 63  # tags outside ±2**63 do not fit the raw headers: such frames are pickled
_DTYPE_CODES = {}   # dtype -> its code (dtype.str as bytes), or None if it cannot go raw
_DTYPES = {}        # code -> dtype
# A raw frame's head is padded so that the array's bytes start _ALIGN bytes into the frame (a
# multiple of every item size): a frame read whole into a buffer of its own is an aligned array.
_ALIGN = 16
# The small-message path caches both ends of a raw frame's head, since a collective sends the
# same tag, dtype and shape again and again (building or parsing a head costs more than the
# pipe): _HEADS, (tag, dtype, shape) -> the head, for arrays below SHM_THRESHOLD; _FORMATS,
# a head's bytes after the kind byte -> (tag, dtype, shape). Each holds at most _CACHED.
_HEADS = {}
_FORMATS = {}
_CACHED = 1024


def _dtype_code(dtype):
    """dtype.str as bytes, if that describes the dtype completely (no fields, no objects,
    no sub-arrays, items of at least one byte); else None and the array is pickled."""
    try:
        return _DTYPE_CODES[dtype]
    except KeyError:
        pass
    text = dtype.str
    code = None
    if not dtype.hasobject and dtype.names is None and dtype.itemsize > 0 \
            and dtype.subdtype is None and np.dtype(text) == dtype:
        code = text.encode()
        _DTYPES[code] = np.dtype(text)
    _DTYPE_CODES[dtype] = code
    return code


def encode_frame(tag, payload) -> bytes:
    """The frame for one message. A C-contiguous array of a plain dtype (the common message
    of a collective) goes raw — a header and its bytes, one copy and no pickling; so do a
    bare reference to a segment and an acknowledgement; anything else is pickled (protocol
    5: NumPy keeps non-native byte orders there)."""
    kind = type(payload)
    if not -_BIG_TAG <= tag < _BIG_TAG:       # any integer tag ≥ 0 works, as on every engine
        kind = None
    if kind is np.ndarray and payload.flags.c_contiguous:
        head = _HEADS.get((tag, payload.dtype, payload.shape))
        if head is None:
            head = _raw_head(tag, payload.dtype, payload.shape, payload.nbytes)
        if head is not None:
            # A C-contiguous array hands its bytes to join() through the buffer protocol.
            return b"".join((head, payload))
    elif kind is ShmRef:
        code = _dtype_code(payload.dtype)
        if code is not None and len(payload.shape) <= 64:
            ndim, name = len(payload.shape), payload.name.encode()
            size = _REF_HEAD.size - 8 + len(code) + len(name) + 8 * ndim
            return b"".join((_REF_HEAD.pack(size, _REF, tag, ndim, len(code), len(name)), code,
                             name, _DIMS[ndim].pack(*payload.shape)))
    elif tag == _ACK and kind is not None:
        body = "\n".join(payload).encode()
        return _PICKLED_HEAD.pack(len(body) + 1, _NAMES) + body
    body = pickle.dumps((tag, payload), protocol=5)
    return _PICKLED_HEAD.pack(len(body) + 1, _PICKLED) + body


def _head_size(ndim: int, code_size: int) -> int:
    """Bytes of a raw frame's head (length included) before the array's bytes: padded to
    _ALIGN."""
    size = _RAW_HEAD.size + code_size + 8 * ndim
    return size + -size % _ALIGN


def _raw_head(tag, dtype, shape, nbytes):
    """The head of the raw frame of an array (None if its dtype cannot go raw); kept in
    _HEADS for arrays small enough to go through the pipe."""
    code = _dtype_code(dtype)
    if code is None or len(shape) > 64:
        return None
    ndim = len(shape)
    start = _head_size(ndim, len(code))
    described = _RAW_HEAD.size + len(code) + 8 * ndim
    head = b"".join((_RAW_HEAD.pack(start - 8 + nbytes, _RAW, tag, ndim, len(code)), code,
                     _DIMS[ndim].pack(*shape), bytes(start - described)))
    if nbytes < SHM_THRESHOLD:
        if len(_HEADS) >= _CACHED:
            _HEADS.clear()
        _HEADS[(tag, dtype, tuple(shape))] = head
    return head


def _dtype_of(code: bytes) -> np.dtype:
    """The dtype a frame's dtype code names (cached: decoding a name costs microseconds)."""
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = _DTYPES[code] = np.dtype(code.decode())
    return dtype


def decode_frame(buf, pos, size):
    """(tag, payload) of the frame whose body is buf[pos + 8 : pos + 8 + size]."""
    kind = buf[pos + 8]
    if kind == _RAW:
        _, _, tag, ndim, code_size = _RAW_HEAD.unpack_from(buf, pos)
        at = pos + _RAW_HEAD.size
        dtype = _dtype_of(bytes(buf[at:at + code_size]))
        shape = _DIMS[ndim].unpack_from(buf, at + code_size)
        at = pos + _head_size(ndim, code_size)
        count = (pos + 8 + size - at) // dtype.itemsize
        if not count:
            return tag, np.empty(shape, dtype)
        # A copy the program owns: the read buffer is reused for the next frames.
        return tag, np.frombuffer(buf, dtype, count, at).reshape(shape).copy()
    if kind == _REF:
        _, _, tag, ndim, code_size, name_size = _REF_HEAD.unpack_from(buf, pos)
        at = pos + _REF_HEAD.size
        dtype = _dtype_of(bytes(buf[at:at + code_size]))
        at += code_size
        name = buf[at:at + name_size].decode()
        shape = _DIMS[ndim].unpack_from(buf, at + name_size)
        return tag, ShmRef(name, shape, dtype)
    if kind == _NAMES:
        return _ACK, buf[pos + 9:pos + 8 + size].decode().split("\n")
    with memoryview(buf) as view:
        return pickle.loads(view[pos + 9:pos + 8 + size])


def decode_whole(chunk: bytes):
    """(tag, array) of a raw frame that is the whole of `chunk` (bytes, as read), the common
    case of a small message: the array is a view of one private copy of the chunk — aligned,
    writable, its own — with its head parsed once per (tag, dtype, shape) (`_FORMATS`)."""
    start = (_RAW_HEAD.size + _ALIGN - 1 + chunk[18] + 8 * chunk[17]) & -_ALIGN  # _head_size
    known = _FORMATS.get(chunk[9:start])
    if known is None:
        ndim, code_size, at = chunk[17], chunk[18], _RAW_HEAD.size
        dtype = _dtype_of(chunk[at:at + code_size])
        shape = _DIMS[ndim].unpack_from(chunk, at + code_size)
        (tag,) = _TAG.unpack_from(chunk, 9)
        if len(_FORMATS) >= _CACHED:
            _FORMATS.clear()
        known = _FORMATS[chunk[9:start]] = (tag, dtype, shape)
    tag, dtype, shape = known
    return tag, np.ndarray(shape, dtype, bytearray(chunk), start)



def portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling both ways (so a peer and the parent can have it), else a
    RemoteFailure with its summary."""
    try:
        pickle.loads(pickle.dumps(error, protocol=5))
        return error
    except Exception:
        return RemoteFailure(f"{type(error).__name__}: {error}")
