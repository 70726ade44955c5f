"""The commands that take a converted dataset: ``verify``, ``inspect``, ``report``, ``reindex``, ``tfds-metadata``,
``versions``, ``prune``.

In: the command's arguments (the dataset's folder, local, gs:// or s3://, and its flags). Out: what the
command prints, and its exit status (0 done; 1 the dataset failed a check or could not be read, one
``error:`` line; 2 bad usage, from argparse).

Each parses its arguments first and imports ``reader`` (TensorFlow: seconds) only after, so ``--help`` and a
usage error are as quick as the interpreter and work where TensorFlow is absent (tests/converter/
test_cli_groups.py pins it). ``card`` is :mod:`converter.card`; it never needs TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Optional, Sequence

from converter.cli_logging import configure_logging
from record_files import versions as version_layout


def _dataset_command(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of a subcommand that takes a converted dataset's folder (local, gs:// or s3://).

    It takes the converter's (Beam's) ``--s3_*`` flags too, so the command
    that wrote a dataset into an S3 endpoint can check it with the same flags.
    """
    parser = argparse.ArgumentParser(prog=f"python -m converter {name}", description=description,
                                     epilog="s3:// datasets are reached as the AWS environment says (AWS_ENDPOINT_URL, "
                                     "AWS_ACCESS_KEY_ID...), or as these --s3_* flags do.")
    parser.add_argument("out", help="the dataset folder (a local path, gs://... or s3://...)")
    s3 = parser.add_argument_group("S3 (the converter's flags, default: the AWS environment)")
    for flag in ("endpoint_url", "access_key_id", "secret_access_key", "session_token", "region_name"):
        s3.add_argument(f"--s3_{flag}", default=None, metavar=flag.upper())
    s3.add_argument("--s3_verify", default=None, help="false, or a CA bundle's path")
    s3.add_argument("--s3_disable_ssl", action="store_true", default=None)
    return parser


def _add_version(parser: argparse.ArgumentParser) -> None:
    """``--version N``: the version of a dataset that grows (``--update``) to take, not the latest."""
    parser.add_argument("--version", type=int, default=None, metavar="N",
                        help="the dataset's version N (python -m converter versions lists them; default: the latest)")


def _configure_s3(args: argparse.Namespace) -> None:
    """Hand the ``--s3_*`` flags to the reader's S3 client."""
    from reader import storage

    verify = args.s3_verify
    if isinstance(verify, str) and verify.lower() in ("false", "0", "no"):
        verify = False
    storage.configure_s3(endpoint_url=args.s3_endpoint_url, access_key_id=args.s3_access_key_id,
                         secret_access_key=args.s3_secret_access_key, session_token=args.s3_session_token,
                         region_name=args.s3_region_name, verify=verify,
                         use_ssl=False if args.s3_disable_ssl else None)


def _quiet_tensorflow() -> None:
    """TensorFlow loaded through ``reader`` (without its start-up lines: reader.quiet_start), its warnings hidden
    too unless the environment sets a level: a dataset command's output is its report."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import reader  # noqa: F401


def _on_dataset(args: argparse.Namespace, act: Callable[[argparse.Namespace], int],
                also: tuple[type[Exception], ...] = ()) -> int:
    """Run a dataset command's ``act`` (its arguments parsed) with TensorFlow quiet and the ``--s3_*`` flags
    applied; a missing or malformed dataset (or one of ``also``) is one ``error:`` line and exit 1."""
    _quiet_tensorflow()
    _configure_s3(args)
    from reader.info import DatasetNotFoundError

    try:
        return act(args)
    except (DatasetNotFoundError, ValueError, *also) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def verify(argv: Sequence[str]) -> int:
    """``python -m converter verify OUT [--sample N]``: exit 0 only when every check holds."""
    parser = _dataset_command(
        "verify", "Check a converted dataset: manifest, shard list, every record's CRCs, keys, labels, "
        "SHA-256 and image decode, and counts, bytes and checksums against the manifest.")
    parser.add_argument("--sample", type=int, default=None,
                        help="decode only the first N images of each shard (default: all)")
    _add_version(parser)
    args = parser.parse_args(argv)
    if args.sample is not None and args.sample < 0:
        parser.error(f"--sample must be >= 0, got {args.sample}")

    def check(args: argparse.Namespace) -> int:
        from reader.tools.verify import verify as run_verify

        report = run_verify(args.out, sample=args.sample, version=args.version)
        print(report.format())
        return 0 if report.ok else 1

    return _on_dataset(args, check)


def inspect(argv: Sequence[str]) -> int:
    """``python -m converter inspect OUT [--grid FILE.png]``."""
    parser = _dataset_command(
        "inspect", "Show classes by split, shard sizes, rejected inputs by reason and content duplicates.")
    parser.add_argument("--grid", default=None, help="also write a contact sheet of sample images to this PNG "
                        "(with their boxes and class names, class masks, or class names)")
    parser.add_argument("--split", default=None, help="split of the contact sheet (default: the first)")
    parser.add_argument("--per-class", type=int, default=8, help="images per class on the sheet; objects, masks, "
                        "several labels: its columns (default: %(default)s)")
    _add_version(parser)
    args = parser.parse_args(argv)
    configure_logging(verbose=False)

    def show(args: argparse.Namespace) -> int:
        from reader.info import dataset_info
        from reader.tools.inspect import check_sheet_path, contact_sheet, summarize

        if args.grid:
            check_sheet_path(args.grid)
        info = dataset_info(args.out, version=args.version)  # fail before printing anything
        if args.split:
            info.split(args.split)
        print(summarize(args.out, version=args.version))
        if args.grid:
            sheet = contact_sheet(args.out, args.grid, args.split, args.per_class, version=args.version)
            print(f"contact sheet: {sheet}")
        return 0

    return _on_dataset(args, show)


def reindex(argv: Sequence[str]) -> int:
    """``python -m converter reindex OUT [--all]``: exit 0 when every shard has a sound record index."""
    parser = _dataset_command(
        "reindex", "Rebuild the record index (<shard>.idx) of every shard whose index is missing or damaged, from "
        "the shard itself, once its size and SHA-256 match the manifest. A dataset copied without its .idx files "
        "reads correctly anyway, but starts inside a shard (streams, resuming) then read through the records "
        "before them.")
    parser.add_argument("--all", action="store_true", help="rebuild every index, not only the missing or damaged")

    def fix(args: argparse.Namespace) -> int:
        from reader.record_index import rebuild

        result = rebuild(args.out, every=args.all)
        print(result.format())
        return 1 if result.failed else 0

    return _on_dataset(parser.parse_args(argv), fix)


def tfds_metadata(argv: Sequence[str]) -> int:
    """``python -m converter tfds-metadata OUT``: make OUT readable by ``tfds.builder_from_directory``."""
    parser = _dataset_command(
        "tfds-metadata", "Write TensorFlow Datasets' metadata (dataset_info.json, features.json, the label list) "
        "into a converted dataset, so tfds.builder_from_directory(OUT) reads it. Needs tensorflow-datasets.")

    def write(args: argparse.Namespace) -> int:
        from reader.tools.tfds_metadata import write_tfds_metadata

        names = write_tfds_metadata(args.out)
        print(f"wrote {', '.join(names)} into {args.out}; read it with tfds.builder_from_directory({args.out!r})")
        return 0

    return _on_dataset(parser.parse_args(argv), write, also=(ImportError,))


def report(argv: Sequence[str]) -> int:
    """``python -m converter report OUT [--dest DIR] [--open]``: the dataset's HTML report and report.json;
    1 when the dataset cannot be reported (the message names the file at fault)."""
    parser = argparse.ArgumentParser(
        prog="python -m converter report",
        description="Write report.html (one self-contained page: splits, classes, objects, image sizes, "
                    "rejections, contact sheets, duplicates) and report.json beside the manifest of the version reported: "
                    "OUT, or OUT/versions/<N>/ for a version --update wrote.")
    parser.add_argument("data_dir", metavar="OUT", help="the converted dataset's folder (holding manifest.json)")
    parser.add_argument("--dest", metavar="DIR", help="write the two files here instead (an existing folder)")
    parser.add_argument("--open", action="store_true", help="open the page in a web browser when written")
    _add_version(parser)
    args = parser.parse_args(list(argv))
    configure_logging(verbose=False)
    _quiet_tensorflow()
    from reader.tools.report import write_report

    try:
        paths = write_report(args.data_dir, args.dest, version=args.version)
    except (ValueError, OSError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {paths.html}\nwrote {paths.json}")
    if args.open:
        import pathlib
        import webbrowser

        webbrowser.open(pathlib.Path(os.path.abspath(paths.html)).as_uri())
    return 0


def versions(argv: Sequence[str]) -> int:
    """``python -m converter versions OUT``: each version --update wrote (and version 1), oldest first."""
    parser = _dataset_command(
        "versions", "List a dataset's versions (python -m converter --update writes them): each one's number, "
        "date, records per split, what changed and its content fingerprint; the latest is marked.")

    def show(args: argparse.Namespace) -> int:
        from reader.info import dataset_info, version_numbers

        dataset_info(args.out)  # not a dataset: an error naming why, as every dataset command's
        _print_versions([(number, dataset_info(args.out, version=number).manifest)
                         for number in version_numbers(args.out)])
        return 0

    args = parser.parse_args(argv)
    local = _local_versions(args.out)
    if local is not None:  # the manifests are JSON: no TensorFlow to list them (seconds to load)
        _print_versions(local)
        return 0
    return _on_dataset(args, show)


def _local_versions(out: str) -> Optional[list[tuple[int, dict]]]:
    """Each version's number and manifest of a local dataset, oldest first (pruned ones left out), read with
    ``open``; None when OUT is not local or is not a dataset whose latest manifest parses (the reader then reads
    it, naming what is wrong, as every dataset command)."""
    if "://" in out:
        return None
    pointer = os.path.join(out, version_layout.POINTER_FILE)
    found = []
    try:
        try:
            with open(pointer, encoding="utf-8") as handle:
                latest = version_layout.parse_pointer(handle.read(), pointer)
        except FileNotFoundError:
            latest = version_layout.FIRST_VERSION
        for number in range(version_layout.FIRST_VERSION, latest + 1):
            path = os.path.join(out, version_layout.manifest_path(number))
            if os.path.exists(path):
                with open(path, encoding="utf-8") as handle:
                    found.append((number, json.load(handle)))
    except (OSError, ValueError):
        return None
    well_formed = all(isinstance(manifest, dict) and isinstance(manifest.get("splits"), dict) for _, manifest in found)
    return found if found and found[-1][0] == latest and well_formed else None


def _print_versions(manifests: list[tuple[int, dict]]) -> None:
    """One line a version: the latest marked, its number, date, content fingerprint, records per split, changes."""
    for number, manifest in manifests:
        counts = ", ".join(f"{name} {split.get('num_examples')}" for name, split in manifest["splits"].items())
        changes = manifest.get("changes")
        # masked shards are reused files too, with records hidden: counted apart, as the update's summary does
        masked = f", {changes['masked_shards']} masked" if changes and changes.get("masked_shards") else ""
        changed = (f"  +{changes['added']} ~{changes['changed']} -{changes['deleted']}, "
                   f"{changes['reused_shards']} shards reused{masked}, {changes['new_shards']} new" if changes
                   else "  (converted)")
        print(f"{'*' if number == manifests[-1][0] else ' '} {number:>4}  {manifest.get('created', '?')}  "
              f"{version_layout.digest(version_layout.manifest_content(manifest))}  {counts}{changed}")


def prune(argv: Sequence[str]) -> int:
    """``python -m converter prune OUT --keep K``: delete the versions before the K latest and every file no kept
    version reads (never a file no version lists)."""
    parser = argparse.ArgumentParser(
        prog="python -m converter prune",
        description="Delete a dataset's versions older than the K latest, and every shard, index and table that "
                    "no kept version reads. Files that are no version's are never touched.")
    parser.add_argument("out", metavar="OUT", help="the dataset folder (local)")
    parser.add_argument("--keep", type=int, required=True, metavar="K", help="versions to keep, the latest included")
    args = parser.parse_args(list(argv))
    if args.keep < 1:
        parser.error(f"--keep must be at least 1 (the latest version), got {args.keep}")
    configure_logging(verbose=False)
    from beam_jobs.files import publish, version_store

    try:
        with publish.output_lock(args.out):
            pruned = version_store.prune(args.out, args.keep)
    except (publish.PublishError, version_store.VersionError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not pruned.versions:
        print(f"nothing to prune: {args.out} has at most {args.keep} versions")
    else:
        print(f"pruned versions {', '.join(map(str, pruned.versions))} of {args.out}: {len(pruned.files)} files, "
              f"{pruned.num_bytes:,} bytes")
    return 0

