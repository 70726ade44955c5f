"""Hostile input: random and mutated bytes, bombs, huge dimensions, deep and looping folders.

The converter must never crash: every file is either converted to a JPEG that
decodes to its declared size, or rejected with a reason, and the accounting
adds up (inputs = written + rejected + skipped).
"""

from __future__ import annotations

import io
import json
import os
import time

import pytest
import simplejpeg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import record_schema
from beam_jobs.options import EncodeOptions
from beam_jobs.planning.discover import list_tree, plan_inputs
from beam_jobs.stages.encode import Encoded, Rejected, encode_image
from tests.conftest import make_sample_images, run_converter

SEEDS = make_sample_images()
VALID = [SEEDS[k] for k in ("jpeg_rgb", "jpeg_progressive", "png_rgba", "gif", "bmp", "tiff", "webp", "jpeg_cmyk")]


def _check(result) -> None:
    if isinstance(result, Rejected):
        assert result.reason and result.detail
        return
    assert isinstance(result, Encoded)
    height, width, _, _ = simplejpeg.decode_jpeg_header(result.data)
    assert (height, width) == (result.height, result.width)
    pixels = Image.open(io.BytesIO(result.data))
    pixels.load()  # a stored image always decodes fully
    assert pixels.size == (result.width, result.height)


@st.composite
def mutated_images(draw):
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "overwrite"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[pos:pos + draw(st.integers(1, 4096))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=64))
        else:
            chunk = draw(st.binary(min_size=1, max_size=32))
            data[pos:pos + len(chunk)] = chunk
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_images())
def test_mutated_images_are_converted_or_rejected_never_crash(data):
    _check(encode_image(data, EncodeOptions()))


def test_every_corrupted_byte_of_a_64_bit_float_tiffs_header_is_converted_or_rejected_quietly(caplog):
    """The tifffile path (Pillow cannot open such TIFFs) on hostile bytes: Hypothesis found a TypeError there."""
    import numpy as np
    import tifffile

    buffer = io.BytesIO()
    tifffile.imwrite(buffer, np.linspace(0, 1, 24 * 32).reshape(24, 32), photometric="minisblack")
    data = buffer.getvalue()
    header = len(data) - 24 * 32 * 8  # tags and offsets, before the pixels
    for position in range(header):
        for value in (0x00, 0xFF, data[position] ^ 0x5A):
            _check(encode_image(data[:position] + bytes([value]) + data[position + 1:], EncodeOptions()))
    assert not [record for record in caplog.records if record.name.startswith("tifffile")]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from([b"", b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF89a",
                                                   b"BM", b"II*\x00", b"RIFF\x00\x00\x00\x00WEBP"]))
def test_random_bytes_behind_any_magic_never_crash(body, magic):
    _check(encode_image(magic + body, EncodeOptions()))


@pytest.mark.parametrize("width,height", [(100_000, 100_000), (1, 2_000_000_000), (65_535, 65_535)])
def test_huge_declared_dimensions_are_rejected_fast_without_decoding(width, height):
    from tests.conftest import _png_with_size

    # This thread's CPU time, not the clock's: a loaded machine can hold the thread off the CPU for longer than
    # the whole check takes (a few ms), while decoding any of these would take it minutes (or all the memory).
    started = time.thread_time()
    result = encode_image(_png_with_size(width, height), EncodeOptions())
    assert isinstance(result, Rejected) and result.reason == "too-many-pixels"
    assert time.thread_time() - started < 1.0


@pytest.mark.slow
def test_a_real_decompression_bomb_is_rejected_before_its_pixels_are_allocated():
    # 20000 x 20000 of one colour: a few hundred KB of PNG, 1.2 GB of pixels.
    buffer = io.BytesIO()
    Image.new("L", (20_000, 20_000)).save(buffer, "PNG", optimize=True)
    result = encode_image(buffer.getvalue(), EncodeOptions(max_pixels=50_000_000))
    assert isinstance(result, Rejected) and result.reason == "too-many-pixels"


def test_deeply_nested_and_looping_folders_list_in_bounded_time(tmp_path):
    deep = tmp_path / "src" / "cat"
    path = deep
    for level in range(300):  # deeper than Python's default recursion limit would allow recursively
        path = path / f"d{level}"
    path.mkdir(parents=True)
    (path / "deep.jpg").write_bytes(b"x")
    for index in range(20):  # a web of links back up the tree
        os.symlink(str(tmp_path / "src"), str(deep / f"loop{index}"))
    started = time.monotonic()
    listing = list_tree(str(tmp_path / "src"))
    assert time.monotonic() - started < 10
    plan = plan_inputs(listing)
    assert len(plan.refs) == 1 and list(plan.refs)[0].relpath.endswith("/deep.jpg")
    assert listing.skipped == {"repeated-folder-link": 20}


@pytest.mark.e2e
def test_a_tree_of_hostile_files_converts_and_the_accounting_adds_up(tmp_path):
    import random

    rng = random.Random(5)
    src = tmp_path / "src"
    names = list(SEEDS)
    listed = 0
    for index in range(60):
        folder = src / f"class{index % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        data = bytearray(SEEDS[rng.choice(names)])
        for _ in range(rng.randint(0, 3)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        (folder / f"f{index}.jpg").write_bytes(bytes(data))
        listed += 1
    (src / "class0" / ".hidden.jpg").write_bytes(SEEDS["jpeg_rgb"])
    (src / "notes.txt").write_text("stray")
    out = tmp_path / "out"
    run_converter("--src", str(src), "--out", str(out), "--shards", "3", "--max-bad-fraction", "1",
                  "--no-progress", "--direct_running_mode=in_memory", check=True)
    manifest = json.loads((out / record_schema.MANIFEST_FILE).read_text())
    written = sum(split["num_examples"] for split in manifest["splits"].values())
    assert manifest["num_skipped"] == 2
    assert written + manifest["num_rejected"] == listed
    assert written + manifest["num_rejected"] + manifest["num_skipped"] == listed + 2
    from reader.tools.verify import verify

    assert verify(str(out)).ok
