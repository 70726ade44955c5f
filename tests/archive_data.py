"""Archives made from generated folders, as datasets ship them: with ``tarfile`` and ``zipfile``, seeded.

Every function packs a folder the tests already made, so a test can convert
the archive and the folder and compare the bytes.
"""

from __future__ import annotations

import io
import os
import pathlib
import random
import tarfile
import zipfile


def _files(folder) -> list[tuple[str, pathlib.Path]]:
    """``(relative path, file)`` under ``folder``, by path (archives list members in a fixed order)."""
    folder = pathlib.Path(folder)
    return sorted((path.relative_to(folder).as_posix(), path) for path in folder.rglob("*") if path.is_file())


def tar_folder(folder, out, mode: str = "w", top: str = "") -> str:
    """``folder``'s files into a tar at ``out`` (``mode`` "w", "w:gz", "w:bz2", "w:xz"), under ``top/`` if given."""
    with tarfile.open(out, mode, format=tarfile.GNU_FORMAT) as archive:
        for rel, path in _files(folder):
            info = tarfile.TarInfo(f"{top}/{rel}" if top else rel)
            info.size, info.mtime = path.stat().st_size, 1_700_000_000
            with open(path, "rb") as handle:
                archive.addfile(info, handle)
    return str(out)


def zip_folder(folder, out, top: str = "", method: int = zipfile.ZIP_DEFLATED) -> str:
    """``folder``'s files into a zip at ``out``, under ``top/`` if given (what ``zip -r out top/`` makes)."""
    with zipfile.ZipFile(out, "w", method) as archive:
        for rel, path in _files(folder):
            archive.write(path, f"{top}/{rel}" if top else rel)
    return str(out)


def tar_of_tars(folder, out, inner_mode: str = "w") -> str:
    """ImageNet's train tar: one inner tar per sub-folder of ``folder`` (``<class>.tar`` of its files)."""
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as archive:
        for entry in sorted(pathlib.Path(folder).iterdir()):
            suffix = {"w": ".tar", "w:gz": ".tar.gz"}[inner_mode]
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode=inner_mode, format=tarfile.GNU_FORMAT) as class_tar:
                for rel, path in _files(entry):
                    class_tar.add(path, rel)
            info = tarfile.TarInfo(entry.name + suffix)
            info.size = len(inner.getvalue())
            archive.addfile(info, io.BytesIO(inner.getvalue()))
    return str(out)


def imagenet_archives(tree, out_folder) -> str:
    """A miniature ImageNet as image-net.org ships it, from the tree ``write_imagenet_tree`` made:
    ``ILSVRC2012_img_train.tar`` (a tar of class tars) and ``ILSVRC2012_img_val.tar`` (flat)."""
    os.makedirs(out_folder, exist_ok=True)
    tar_of_tars(os.path.join(tree, "train"), os.path.join(out_folder, "ILSVRC2012_img_train.tar"))
    tar_folder(os.path.join(tree, "val"), os.path.join(out_folder, "ILSVRC2012_img_val.tar"))
    return str(out_folder)


def webdataset_shards(folder, out_folder, shards: int = 2, seed: int = 0) -> dict[str, str]:
    """``folder``'s class folders as img2dataset writes them: ``out_folder/0000N.tar`` shards of samples
    ``<key>.<ext>`` + ``<key>.cls`` (the class index) + ``<key>.json`` (``{"label": class}``) + ``<key>.txt``,
    shuffled (seeded). Returns each image's path in the extraction (``00000/<key>.<ext>``) -> class name."""
    import json
    import random

    folder = pathlib.Path(folder)
    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    samples = [(name, path) for name in classes for _, path in _files(folder / name)]
    random.Random(seed).shuffle(samples)
    os.makedirs(out_folder, exist_ok=True)
    expected = {}
    for shard in range(shards):
        with tarfile.open(os.path.join(out_folder, f"{shard:05d}.tar"), "w", format=tarfile.GNU_FORMAT) as archive:
            for index, (name, path) in enumerate(samples[shard::shards]):
                key = f"{shard:05d}{index:04d}"
                members = {path.suffix.lstrip(".").lower(): path.read_bytes(),
                           "cls": str(classes.index(name)).encode(), "json": json.dumps({"label": name}).encode(),
                           "txt": b"a caption"}
                for extension, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
                expected[f"{shard:05d}/{key}.{path.suffix.lstrip('.').lower()}"] = name
    return expected


def write_tree(folder, classes=("cat", "dog"), per_class=3, seed=0) -> dict[str, bytes]:
    """Class folders of random bytes (the listing does not decode): ``{relative path: bytes}``."""
    rng = random.Random(seed)
    files = {}
    for name in classes:
        for i in range(per_class):
            files[f"{name}/{name}_{i}.jpg"] = rng.randbytes(rng.randint(10, 3000))
    for rel, data in files.items():
        path = pathlib.Path(folder, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def hostile_tar(path) -> None:
    """A tar of every hostile member kind: unsafe names, a link, a FIFO, a name twice; last, ``dog/last.jpg``
    of ``"cut" * 400`` (cut inside it for a truncated tar)."""
    def add(archive, name, data=b"x", kind=tarfile.REGTYPE, link=""):
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
        archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        add(archive, "cat/ok.jpg", b"fine")
        add(archive, "../../escape.jpg")
        add(archive, "/etc/passwd")
        add(archive, "cat/link.jpg", kind=tarfile.SYMTYPE, link="/etc/passwd")
        add(archive, "cat/fifo.jpg", kind=tarfile.FIFOTYPE)
        add(archive, "cat/twice.jpg", b"first")
        add(archive, "cat/twice.jpg", b"second")
        add(archive, "dog/last.jpg", b"cut" * 400)


def nested_tar(levels: int) -> bytes:
    """A tar holding a tar holding ... ``levels`` deep, the innermost holding ``img.jpg``."""
    data, name = b"deep", "img.jpg"
    for level in range(levels):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as archive:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        data, name = out.getvalue(), f"level{level}.tar"
    return data
