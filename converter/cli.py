"""Parse the command line and call the library; no conversion logic lives here.

``python -m converter --src DIR [options] [Beam pipeline options]`` converts.
The converter's own flags (converter/convert_flags.py) are parsed here; every
other flag goes untouched to Beam's ``PipelineOptions`` (the split Beam's
wordcount example makes), so ``--runner``, ``--direct_num_workers``,
``--project`` and friends just work. The commands on a converted dataset are
converter/dataset_commands.py and converter/card.py.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import logging
import signal
import sys
import traceback
from typing import Optional, Sequence

from beam_jobs.runtime import interrupt
from converter import convert_flags, dataset_commands
from converter.card import main as card_main
from converter.cli_logging import configure_logging

logger = logging.getLogger("converter")

SUBCOMMANDS = ("convert", "verify", "inspect", "report", "card", "reindex", "tfds-metadata", "versions", "prune")

_EPILOG = """\
Other commands:
  python -m converter verify OUT [--sample N]     check every shard and record against the manifest
  python -m converter inspect OUT [--grid F.png]  classes by split, shard sizes, rejections, duplicates
  python -m converter report OUT [--dest DIR]     report.html + report.json: figures, contact sheets, duplicates
  python -m converter card OUT [--card F]         write OUT/croissant.json (Croissant metadata)
  python -m converter reindex OUT [--all]         rebuild missing or damaged record indexes (.idx) from the shards
  python -m converter tfds-metadata OUT           write TFDS's metadata: tfds.builder_from_directory(OUT)
  python -m converter versions OUT                the versions --update wrote: date, counts, changes, fingerprint
  python -m converter prune OUT --keep K          delete what none of the K latest versions reads

Any other flag is an Apache Beam pipeline option, passed to PipelineOptions untouched, e.g.
  --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp --setup_file=./setup.py
  --direct_num_workers=N   (local runs use every core by default)

Exit status: 0 only when the dataset was published; 1 for a failed conversion; 2 for bad usage;
130 after Ctrl-C (SIGINT), 143 after SIGTERM, 129 after SIGHUP. A stopped run keeps its finished work
(the line it ends with says where) and the same command resumes from it.
"""


def build_convert_parser() -> argparse.ArgumentParser:
    """The flags of a conversion, in groups (converter/convert_flags.py), with the other commands below."""
    return convert_flags.build_convert_parser(_EPILOG)


def _our_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The flags to suggest for a typo: ours, less the old spellings (hidden)."""
    return [s for action in parser._actions if action.help != argparse.SUPPRESS
            for s in action.option_strings if s.startswith("--")]


def _reject_near_misses(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> None:
    """A flag that is almost one of ours is a typo, not a Beam option: say so."""
    ours = _our_flags(parser)
    for arg in unknown:
        if not arg.startswith("--"):
            continue
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, ours, n=1, cutoff=0.8)
        if close:
            parser.error(f"unknown option {name}; did you mean {close[0]}?")


def convert(argv: Sequence[str]) -> int:
    """``python -m converter [convert] --src ...``."""
    parser = build_convert_parser()
    args, pipeline_args = parser.parse_known_args(argv)
    _reject_near_misses(parser, pipeline_args)
    configure_logging(args.verbose)
    for warning in convert_flags.deprecations(args):
        logger.warning(warning)
    try:
        options = convert_flags.convert_options(args)
    except ValueError as err:
        parser.error(str(err))
    if args.rehash and not args.update:
        parser.error("--rehash compares files by their bytes for --update; give --update too")
    if args.update and args.overwrite:
        parser.error("--update adds a version to --out's dataset, --overwrite replaces it: give one")
    # OUT is known before Beam loads (seconds), so a stop while it loads says the same as any other.
    interrupt.set_exit_message(_stop_line("{verb}", options.out, published=False))
    # (An update converts what changed, usually few images: in the launcher's own process, no workers started.)
    if not args.update and not any(arg.startswith(("--runner", "--direct_running_mode")) for arg in pipeline_args):
        from beam_jobs.runtime import worker_start

        # only for runs with workers, whose Beam then loads beside the launcher's (worker_start)
        worker_start.start_for(options.src, pipeline_args, downsizing=options.encode.max_side is not None)
    from beam_jobs import pipeline  # Beam loads only now, after logging is set
    from beam_jobs.files import publish
    from beam_jobs.planning import discover
    from beam_jobs.files.version_store import VersionError as _VersionError
    from beam_jobs.runtime import runners

    interrupt.raise_if_received()  # a signal while Beam loaded whose exception Python lost in an import callback
    try:
        if args.update:  # a new version of OUT from what changed (beam_jobs/update/)
            from beam_jobs import update

            summary = update.run(options, pipeline_args, args.rehash, "auto" if args.progress else False)
        else:
            summary = pipeline.run(options, pipeline_args, show_progress="auto" if args.progress else False)
    except interrupt.Interrupted as err:
        # Cleanup (workers, scratch, lock) ran on the way out; nothing else is worth a traceback.
        line = _stop_line(err.verb, options.out, err.published) + (f". {err.kept}" if err.kept else "")
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            print("\n" + line, file=sys.stderr)
        return err.exit_status
    except runners.UnknownFlagError as err:
        if err.flag.startswith("-"):
            hint = runners.suggest(err.flag, _our_flags(parser) + runners.beam_flag_names())
            parser.error(f"unknown option {err.flag}{hint} (not an option of the converter nor of Apache Beam)")
        parser.error(str(err))
    except runners.BadFlagValueError as err:
        parser.error(str(err))
    except (discover.InputError, publish.PublishError, pipeline.TooManyRejectedError, _VersionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        if err.errno not in _DISK_ERRNOS:
            raise
        print(f"error: {disk_error_line(err)}", file=sys.stderr)
        return 1
    except pipeline.ConversionFailedError as err:
        if args.verbose:
            traceback.print_exception(err.__cause__ or err, file=sys.stderr)
        print(f"error: {err}" + ("" if args.verbose else "\n(run with -v for the full trace)"), file=sys.stderr)
        return 1
    print(summary.format())
    return 0


# The launcher's own files failing (a full, read-only or forbidden disk: its staging, scratch, an update's
# downloads): the user's to fix, so a line naming the file, not a traceback.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})


def disk_error_line(err: OSError) -> str:
    """The line a run stopped by its own file's failure prints: the file, the system's reason, what to do."""
    where = f"{err.filename}: " if err.filename else ""
    return (f"{where}{err.strerror or err}; the run stopped (a dataset already in --out is unchanged unless it "
            "said it published). Free space or fix the permissions (the scratch files go to TMPDIR), then run the "
            "same command again")


def _stop_line(verb: str, out: str, published: bool) -> str:
    """The one line a stopped conversion prints."""
    if published:
        return f"{verb}: the signal came while publishing, so {out} was published whole first"
    return f"{verb}: nothing was published; {out} is unchanged"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the process exit status.

    ``python -m converter --src ...`` (or ``convert --src ...``) converts;
    ``verify OUT`` and ``inspect OUT`` check and describe a dataset.
    """
    # First, before Beam or TensorFlow load (seconds): a signal at any moment is one line and an exit status.
    interrupt.install(exit_message="{verb}")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "convert"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    try:
        return {"convert": convert, "verify": dataset_commands.verify, "inspect": dataset_commands.inspect,
                "reindex": dataset_commands.reindex, "report": dataset_commands.report, "card": card_main,
                "tfds-metadata": dataset_commands.tfds_metadata, "versions": dataset_commands.versions,
                "prune": dataset_commands.prune}[command](rest)
    except KeyboardInterrupt as err:  # before or after the run itself (while loading, verifying...)
        stop = err if isinstance(err, interrupt.Interrupted) else interrupt.Interrupted(signal.SIGINT)
        return _stopped(stop)
    except Exception as err:  # a stop that Python wrapped on its way (raised while a class was made: an import)
        stop = interrupt.stop_behind(err)
        if stop is None:
            raise
        return _stopped(stop)


def _stopped(stop: interrupt.Interrupted) -> int:
    """The one line a run stopped outside its own handling prints (OUT named when known); its exit status."""
    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
        print("\n" + interrupt.exit_line(stop.signum), file=sys.stderr)
    return stop.exit_status
