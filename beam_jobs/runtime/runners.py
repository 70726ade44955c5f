"""Which Beam runner a conversion runs on, and the pipeline options it gets.

Without ``--runner`` (or with ``--runner=DirectRunner``) a conversion runs on
Beam's FnApiRunner in multi-processing mode, one worker process per core:
the runner every test and benchmark of this project exercises. We build it
ourselves instead of letting Beam's DirectRunner choose, because since Beam
2.68 the DirectRunner first tries the Prism runner, a Go binary it downloads
from GitHub at run time: online users would silently get a different runner
(one that ignores ``--direct_num_workers``) and a user behind a slow proxy
would wait for a download. Prism runs only when asked for
(``--runner=PrismRunner``). Every other runner is Beam's own, by name.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shlex
import sys
from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_jobs.runtime import log_filters, worker_handler, worker_start
from beam_jobs.runtime.work_size import (  # noqa: F401 - the rule's figures, named here as before
    CHECK_BYTES_PER_S, DOWNSIZE_BYTES_PER_S, PER_IMAGE_S, WORKERS_FROM_S, Work, wants_workers)

# Every run's defaults: Beam's type inference and checking while it builds the pipeline off (a documented
# TypeOptions flag). They parse Beam's options again for each transform applied and each type compared (about 350
# of the 500 option parsers a run built, 0.3-0.4 s of CPU whatever its size). Without them Beam codes every element
# with its default coder: ours are a few small Python objects a part, never an image, and the output's bytes do
# not depend on the coder (tests/converter/test_pinned_output.py).
_BUILD_DEFAULTS = ["--no_pipeline_type_check"]
# The runner names that mean "the local runner we test".
_LOCAL_NAMES = ("directrunner", "fnapirunner")
# Running mode the FnApiRunner does not know, so it keeps the worker environment we give it.
_OWN_WORKERS = "multi_processing/beam_jobs.runtime.local_worker"


class UnknownFlagError(ValueError):
    """A command-line flag that neither the converter nor Beam's pipeline options define.

    ``flag`` is the flag (or stray value) at fault, so a caller that owns other
    flags can suggest among them too.
    """

    def __init__(self, message: str, flag: str) -> None:
        super().__init__(message)
        self.flag = flag


class BadFlagValueError(ValueError):
    """A Beam flag given a value the run cannot use (``--direct_num_workers=-2``): a usage error naming it."""


def _check_flag_values(args: Sequence[str]) -> None:
    """Values Beam would accept and then fail on deep inside a run: refused before anything is written."""
    for index, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name != "--direct_num_workers":
            continue
        if not equals:
            value = args[index + 1] if index + 1 < len(args) else ""
        try:
            workers = int(value)
        except ValueError:
            workers = -1
        if workers < 0:
            raise BadFlagValueError(f"--direct_num_workers must be a whole number of worker processes (0: one per core), "
                                    f"got {value!r}")


@dataclasses.dataclass(frozen=True)
class RunnerChoice:
    """The runner of a run and its options.

    Attributes:
      options: Beam pipeline options, with our defaults filled in.
      runner: a runner object to hand to ``beam.Pipeline``, or None to let Beam
        create the one ``options`` names.
      description: what the manifest records, e.g. ``FnApiRunner (multi_processing, 2 workers)``.
      local: the run's workers are processes or threads of this machine.
    """

    options: PipelineOptions
    runner: Optional[beam.runners.PipelineRunner]
    description: str
    local: bool
    # The caller's flags, when they leave the local runner's mode and worker count to us (see sized_for).
    sizable_args: Optional[tuple[str, ...]] = None


def choose_runner(pipeline_args: Sequence[str]) -> RunnerChoice:
    """The runner and options for ``pipeline_args`` (the flags the converter does not own).

    Every flag the user gives wins over our defaults.

    Raises:
      UnknownFlagError: a flag no Beam options class defines (a typo would
        otherwise be dropped by Beam with a log line nobody sees).
      BadFlagValueError: a value that would fail the run later (``--direct_num_workers=-2``).
      ImportError: ``--runner=dask`` without the dask extra.
    """
    args = list(pipeline_args)
    _check_flag_values(args)
    runner = PipelineOptions(args).view_as(StandardOptions).runner
    name = str(runner or "").rsplit(".", 1)[-1].lower()
    _check_runner_name(runner)
    if runner is None or name in _LOCAL_NAMES:
        args = [arg for arg in args if not arg.startswith("--runner")]
        defaults = ["--direct_num_workers=0", "--direct_running_mode=multi_processing", *_BUILD_DEFAULTS]
        options = PipelineOptions(_with_defaults(args, defaults))
        check_known_flags(args)
        runner_object, description = _local_runner(options)
        ours = not any(arg.startswith(("--direct_running_mode", "--direct_num_workers")) for arg in args)
        return RunnerChoice(options, runner_object, description, local=True,
                            sizable_args=tuple(args) if ours else None)
    if name in ("dask", "daskrunner") or "dask_runner" in str(runner):
        options = _dask_options(args)
        check_known_flags(args)
        return RunnerChoice(options, None, "DaskRunner", local=False)
    options = PipelineOptions(_with_defaults(args, _BUILD_DEFAULTS))
    check_known_flags(args)
    return RunnerChoice(options, None, str(runner).rsplit(".", 1)[-1], local=name == "prismrunner")


def sized_for(choice: RunnerChoice, work: Work) -> RunnerChoice:
    """``choice``, or, for a local run whose mode the user left to us and whose work is too small to pay for
    starting worker processes, the in-process runner. Never changes the output (every runner writes the same
    bytes)."""
    if choice.sizable_args is None or wants_workers(work):
        return choice
    options = PipelineOptions(_with_defaults([*choice.sizable_args, "--direct_num_workers=1",
                                              "--direct_running_mode=in_memory"], _BUILD_DEFAULTS))
    runner, description = _local_runner(options)
    return dataclasses.replace(choice, options=options, runner=runner, description=description)


def spreads_tasks(choice: RunnerChoice) -> bool:
    """Whether the run's tasks may run on more than one worker, so that a Reshuffle spreading them pays: every
    runner but our local one on a single worker (the launcher's own process, or one worker process)."""
    return choice.runner is None or choice.options.view_as(DirectOptions).direct_num_workers != 1


def starts_workers(choice: RunnerChoice) -> bool:
    """Whether ``choice`` may start local worker processes (then worst case they start, so start early)."""
    return choice.local and choice.options.view_as(DirectOptions).direct_running_mode == _OWN_WORKERS


def runner_names() -> list[str]:
    """The runner names ``--runner`` takes: Beam's known runners, and ``dask``."""
    return sorted({path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS} | {"DaskRunner"})


def _check_runner_name(runner: Optional[str]) -> None:
    """A short runner name Beam does not know is a usage error with a suggestion, not a failed run.

    A dotted name is a runner class's import path, which Beam imports itself.
    """
    if runner is None or "." in str(runner):
        return
    known = {name.lower(): name for name in runner_names()}
    lowered = str(runner).lower()
    if lowered in known or lowered + "runner" in known or lowered == "dask":
        return
    close = difflib.get_close_matches(lowered, list(known), n=1, cutoff=0.7)
    hint = f"; did you mean --runner={known[close[0]]}?" if close else ""
    raise UnknownFlagError(f"--runner={runner} is not a Beam runner{hint} (runners: {', '.join(runner_names())})",
                           str(runner))


def _local_runner(options: PipelineOptions) -> tuple[beam.runners.PipelineRunner, str]:
    """Beam's FnApiRunner, set up as the DirectRunner sets it up when it falls back from Prism.

    Workers get the pipeline options through the provision info; in
    multi-processing mode they are started as ``python -m beam_jobs.runtime.local_worker``,
    Beam's SDK harness with its start-up chatter off unless the harness log
    level asks for it.
    """
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle
    from apache_beam.transforms import environments

    direct = options.view_as(DirectOptions)
    workers = direct.direct_num_workers or os.cpu_count() or 1
    mode = direct.direct_running_mode
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    environment = None
    if mode == "multi_processing":
        # exec: no shell in between. The stop signals are ignored before Python starts (an ignored signal
        # stays ignored across exec, and CPython keeps it so): a worker spawned just as Ctrl-C reaches the
        # process group would otherwise die in its start-up with a "Fatal Python error" on the terminal.
        # The launcher stops its workers itself (beam_jobs.runtime.interrupt).
        command = f"trap '' INT TERM HUP; exec {shlex.quote(sys.executable)} -m beam_jobs.runtime.local_worker"
        worker_start.FORKED_COMMAND = command  # forked from the forkserver instead, once it runs (worker_start)
        worker_handler.install()  # the handler that forks them, or Beam's own with a warning naming what moved
        environment = environments.SubprocessSDKEnvironment.from_command_string(command_string=command)
        # FnApiRunner.run_pipeline replaces its environment with Beam's own worker command when it
        # sees this mode; the workers already have the options (above), so the runner sees our name.
        direct.direct_running_mode = _OWN_WORKERS
    runner = fn_runner.FnApiRunner(default_environment=environment, provision_info=provision)
    log_filters.drop_relayed_worker_logs()
    return runner, f"FnApiRunner ({mode}, {workers} worker{'s' if workers != 1 else ''})"


def _dask_options(args: list[str]) -> PipelineOptions:
    """``--runner=dask`` is short for Beam's DaskRunner, with one element per Dask partition."""
    try:
        # Registers DaskOptions (--dask_client_address...) before Beam parses them.
        from apache_beam.runners.dask import dask_runner
    except ImportError as err:
        raise ImportError("--runner=DaskRunner needs the dask extra: pip install '.[dask]'") from err
    args = [arg for arg in args if not arg.startswith("--runner")]
    # Beam's default packs 128 of our coarse elements (chunks of 64 images) into one Dask
    # partition, leaving workers idle; one per partition costs ~0.1 s of task overhead each.
    # Two partitions per worker thread balances the two.
    threads = _dask_threads(PipelineOptions(args).view_as(dask_runner.DaskOptions))
    defaults = [f"--runner={dask_runner.__name__}.DaskRunner", f"--dask_npartitions={2 * threads}", *_BUILD_DEFAULTS]
    return PipelineOptions(_with_defaults(args, defaults, exclusive={"--dask_npartitions": "--dask_partition_size"}))


def _dask_threads(options: PipelineOptions) -> int:
    """Worker threads of the Dask cluster the run will use (this machine's cores for a local cluster)."""
    address = options.get_all_options().get("address")
    if not address:
        return os.cpu_count() or 1
    import distributed

    with distributed.Client(address, timeout=30) as client:
        return max(1, sum(client.nthreads().values()))


def _with_defaults(args: list[str], defaults: list[str], exclusive: Optional[dict[str, str]] = None) -> list[str]:
    """``args`` plus each default flag the user did not give (nor its mutually exclusive partner)."""
    given = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    exclusive = exclusive or {}
    extra = [flag for flag in defaults
             if flag.split("=", 1)[0] not in given and exclusive.get(flag.split("=", 1)[0]) not in given]
    return args + extra


def beam_flag_names() -> list[str]:
    """Every ``--flag`` of the pipeline options classes imported so far."""
    return sorted({s for action in _beam_parser()._actions for s in action.option_strings if s.startswith("--")})


def _beam_parser():
    """The parser Beam builds in ``PipelineOptions.get_all_options`` (every options class registered)."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    classes: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        classes.setdefault(str(cls), cls)
    for cls in classes.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 - the same call Beam makes
    return parser


def check_known_flags(args: Sequence[str], ours: Sequence[str] = ()) -> None:
    """Refuse flags Beam would drop: Beam only logs "Discarding unparseable args" and runs on.

    Raises:
      UnknownFlagError: naming the first unknown flag (or stray value), with a
        suggestion among ``ours`` and Beam's flags when one is close.
    """
    _, unknown = _beam_parser().parse_known_args(list(args))
    if not unknown:
        return
    arg = unknown[0]
    if not arg.startswith("-"):
        raise UnknownFlagError(f"unexpected argument {arg!r}: every option is a --flag (e.g. --src {arg})", arg)
    flag = arg.split("=", 1)[0]
    raise UnknownFlagError(f"unknown option {flag}{suggest(flag, list(ours) + beam_flag_names())}", flag)


def suggest(arg: str, candidates: Sequence[str]) -> str:
    """``"; did you mean --x?"`` for the candidate closest to ``arg``, or ``""``."""
    name = "--" + arg.split("=", 1)[0].lstrip("-")
    if name in candidates:  # e.g. -shards for --shards
        return f"; did you mean {name}?"
    prefixed = sorted({c for c in candidates if c.startswith(name) or name.startswith(c) and len(c) > 3})
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75) or prefixed[:3]
    return f"; did you mean {' or '.join(close)}?" if close else ""
