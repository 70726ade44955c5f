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

libtiff also reports errors it recovered from ("Fax4Decode: Bad code word
at line ..."), by default on stderr, once per decode: in the logs of a long
run, from no file in particular. While these checks decode, its error
handler collects them instead, and such a file is rejected with the first
message. Of Pillow's ~1,060 test images, one reports errors (and is
undecodable anyway); the unstable mutants all do or fail the pixel check.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import io
import os
import platform
import re
import threading
from typing import Iterator, Optional

import PIL
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
    if hasattr(libc, "vsnprintf"):
        libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
    if hasattr(libc, "mallopt"):
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


_libc = _load_libc()

# libtiff's error handler: void (*)(const char *module, const char *fmt, va_list ap).
_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p)
_errors: list[str] = []
# Where a va_list reaches a C function as one pointer, so ours can hand it on to vsnprintf; elsewhere the
# arguments are left out and the format string alone names the error.
_VA_LIST_IS_A_POINTER = platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64")


@_HANDLER
def _collect(module: Optional[bytes], fmt: Optional[bytes], args: int) -> None:
    if _libc is not None and hasattr(_libc, "vsnprintf") and _VA_LIST_IS_A_POINTER and fmt:
        buffer = ctypes.create_string_buffer(512)
        _libc.vsnprintf(buffer, len(buffer), fmt, args)
        text = buffer.value.decode("utf-8", "replace")
    else:  # the format alone still names the error
        text = re.sub(r"%[-+ #0-9.]*[hlLqjzt]*[diouxXeEfgGaAcsp]", "...", (fmt or b"").decode("utf-8", "replace"))
    _errors.append(f"{(module or b'libtiff').decode('utf-8', 'replace')}: {text}")


def _load_libtiff() -> Optional[ctypes.CDLL]:
    """The libtiff Pillow's wheel bundles (``pillow.libs``), or the system's that a source build links."""
    here = os.path.dirname(os.path.dirname(PIL.__file__))
    candidates = sorted(glob.glob(os.path.join(here, "pillow.libs", "libtiff*.so*")))
    candidates += sorted(glob.glob(os.path.join(os.path.dirname(PIL.__file__), ".dylibs", "libtiff*.dylib")))
    system = ctypes.util.find_library("tiff")
    for name in candidates + ([system] if system else []):
        try:
            libtiff = ctypes.CDLL(name)
        except OSError:
            continue
        libtiff.TIFFSetErrorHandler.restype = ctypes.c_void_p
        libtiff.TIFFSetErrorHandler.argtypes = [ctypes.c_void_p]
        return libtiff
    return None


_libtiff = _load_libtiff()


@contextlib.contextmanager
def _libtiff_errors_collected() -> Iterator[list[str]]:
    """libtiff's error messages while inside, instead of on stderr (the previous handler is restored)."""
    del _errors[:]
    if _libtiff is None:
        yield _errors
        return
    previous = _libtiff.TIFFSetErrorHandler(ctypes.cast(_collect, ctypes.c_void_p))
    try:
        yield _errors
    finally:
        _libtiff.TIFFSetErrorHandler(previous)


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


def load_checked(img: Image.Image, data: bytes) -> Optional[tuple[str, str]]:
    """Load ``img`` (opened from ``data``) and decode ``data`` once more: None, or why the pixels must not be stored.

    ``img`` is loaded either way. Returns ``("unstable-decode", detail)`` when
    the two decodes differ, ``("decode-errors", detail)`` when the decoder
    reported errors it recovered from.
    """
    again = Image.open(io.BytesIO(data), formats=[img.format])
    try:
        with _lock, _libtiff_errors_collected() as collected:
            with _fresh_memory_filled(FIRST_FILL):
                img.load()
            errors = list(collected)  # the first decode's (the second repeats them)
            with _fresh_memory_filled(SECOND_FILL):
                again.load()
        if again.mode != img.mode or again.size != img.size or again.tobytes() != img.tobytes():
            return "unstable-decode", "decodes to different pixels on each decode (the decoder reads memory the file " \
                                      "never wrote); not stored, so every run writes the same bytes"
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return "decode-errors", f"the decoder reported errors it recovered from: {errors[0]}{more}"
        return None
    finally:
        again.close()
