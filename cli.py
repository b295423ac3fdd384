"""The ``kvsim`` command line: the app, its commands and the entry point. Wiring only.

Each command lives in a module of :mod:`kvsim.commands`, by what it wires: ``traces``
(trace-stats, gen, hitrate), ``run`` (run, report), ``compare``, ``plan``, ``backend``
(profile, validate, validate-real) and ``catalog`` (models, gpus); the option groups they
share are defined once in ``options``.

Conventions every command follows:
- ``--json`` prints the command's machine-readable result on stdout and nothing else;
- a :class:`kvsim.errors.KvsimError` becomes one line on stderr and exit status 2 (a lost
  worker process, :class:`kvsim.errors.WorkerLost`, 1);
- a command's ``typer.Exit(n)`` is exit status ``n`` (``kvsim plan``: 3, no deployment).
"""

from __future__ import annotations

import errno
import os
import signal
import sys

import typer

from kvsim import __version__
from kvsim.commands.backend import profile_command, validate_command, validate_real_command
from kvsim.commands.catalog import gpus_command, models_command
from kvsim.commands.compare import compare_command
from kvsim.commands.plan import plan_command
from kvsim.commands.run import report_command, run_command
from kvsim.commands.traces import gen_command, hitrate_command, trace_stats_command
from kvsim.errors import Interrupted, KvsimError, WorkerLost, raise_interrupted

app = typer.Typer(
    name="kvsim",
    help="Simulate and plan the KV cache of LLM serving engines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,          # plain help: wraps at 80 columns, never cuts option names
    context_settings={"show_default": True},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True,
        help="Print the version and exit."),
) -> None:
    """kvsim: replay request traces against a paged KV cache engine and report what happens."""


app.command("trace-stats")(trace_stats_command)
app.command("gen")(gen_command)
app.command("report")(report_command)
app.command("run")(run_command)
app.command("plan")(plan_command)
app.command("hitrate")(hitrate_command)
app.command("compare", options_metavar="[TRACE] --FIELD V1,V2,... [OPTIONS]",
            context_settings={"allow_extra_args": True,
                              "ignore_unknown_options": True})(compare_command)
app.command("profile")(profile_command)
app.command("validate")(validate_command)
app.command("validate-real")(validate_real_command)
app.command("models")(models_command)
app.command("gpus")(gpus_command)


def main() -> None:
    """Console entry point: run the app, turning user errors into one line and exit status 2,
    and SIGINT / SIGTERM into one line and exit status 130 / 143."""
    import gc
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, raise_interrupted)
    # The simulator makes millions of short-lived containers and almost no reference cycles:
    # collecting every 700 allocations cost 1-2 % of a run (256 collections, two full ones
    # through every imported module, on the Mooncake trace), every 20,000 a quarter of that.
    gc.set_threshold(20_000, 20, 20)
    try:
        status = app(standalone_mode=False)     # (a command's typer.Exit(n) returns n)
        for sig in (signal.SIGINT, signal.SIGTERM):     # done: a late signal changes nothing
            signal.signal(sig, signal.SIG_IGN)
        sys.stdout.flush()      # (a reader gone shows here, not as noise at exit)
        if isinstance(status, int) and status:
            sys.exit(status)
    except BrokenPipeError:
        _stdout_closed()
    except SystemExit as e:     # (click and rich end a command whose reader left with 1)
        if e.code == 1 and getattr(e.__context__, "errno", None) == errno.EPIPE:
            _stdout_closed()
        raise
    except Interrupted as e:
        from kvsim.reports.outdir import completed
        left = getattr(e, "left", "") or (f"{completed[-1]}/ holds its complete result"
                                          if completed else "no result was written")
        sys.stderr.write(f"kvsim: interrupted by {signal.Signals(e.signum).name}; {left}\n")
        sys.exit(128 + e.signum)
    except (KvsimError, WorkerLost) as e:
        from kvsim.workloads.sources import naming_stdin
        line = naming_stdin(_error_line(e))
        sys.stderr.write(f"kvsim: error: {line}{_flag_value_hint(line)}\n")
        sys.exit(e.exit_status)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except OSError as e:     # the disk, not the input: a full disk, a vanished directory
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"kvsim: error: {where}{e.strerror or e}\n")
        sys.exit(1)
    except Exception as e:
        if not _is_usage_error(e):
            raise
        if type(e).__name__ == "NoArgsIsHelpError":    # plain `kvsim`: the help, as it is
            sys.stderr.write(e.format_message() + "\n")
            sys.exit(e.exit_code)
        text = " ".join(e.format_message().split()).replace("Value error, ", "")
        sys.stderr.write(f"kvsim: error: {text}{_flag_value_hint(text)}\n")
        sys.exit(e.exit_code)


#: Where a setting given as an option is said to come from (compare's grid: its --FIELD).
_COMMAND_LINE = (None, "command line", "compare options")


def _error_line(e: KvsimError | WorkerLost) -> str:
    """``e`` in one line, a setting given on the command line (or by no file) named by its
    option as typed (``--max-num-seqs: must be at least 1``), not by its schema name."""
    if isinstance(e, WorkerLost):
        return str(e)
    flag = _option_of(e.field) if e.location in _COMMAND_LINE else None
    if flag is None:
        return e.one_line()
    return e.message if e.message.startswith(flag) else f"{flag}: {e.message}"


def _option_of(field: str | None) -> str | None:
    """The option, as typed, that gave the setting ``field`` (its schema or Python name, or
    the option itself) to the command being run; None when no option of that name was
    typed (a setting from a file or a default keeps ``field 'x'``)."""
    if not field or field.startswith("--"):
        return field
    from kvsim.reports.frames import TRACE_OPTIONS
    params = _command_params()
    if params is None:
        return None
    options = {param.name: [o for o in param.opts if o.startswith("--")]
               for param in params if param.param_type_name == "option"}
    for key, (_, flag) in TRACE_OPTIONS.items():
        options.setdefault(key, [flag])
    typed = [arg.split("=", 1)[0] for arg in sys.argv[1:] if arg.startswith("--")]
    return next((flag for flag in options.get(field, ()) if flag in typed), None)


def _command_params() -> list | None:
    """The click parameters of the command being run (None before one is named)."""
    commands = typer.main.get_command(app).commands
    name = next((arg for arg in sys.argv[1:] if arg in commands), None)
    if name is None:
        return None
    return [*commands[name].params,   # (compare takes every run setting as --FIELD)
            *(commands["run"].params if name == "compare" else ())]


#: Words vLLM's command line takes after a boolean flag (``--enable-prefix-caching false``).
_BOOLEAN_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


def _flag_value_hint(text: str) -> str:
    """`` (--enable-prefix-caching takes no value: ...)`` after an error (``text``) when a
    word such as ``false`` was typed after an on/off flag of the command, as vLLM's command
    line allows: kvsim read it as an argument (the trace, pushing the trace given after it
    out as an extra argument); else ``""``."""
    argv = sys.argv[1:]
    for before, word in zip(argv, argv[1:]):
        if word.lower() not in _BOOLEAN_WORDS:
            continue
        flag = next((p for p in _command_params() or () if getattr(p, "is_flag", False)
                     and p.secondary_opts and before in (*p.opts, *p.secondary_opts)), None)
        if flag is not None:
            return (f" ({before} takes no value: write {flag.opts[0]} or "
                    f"{flag.secondary_opts[0]})")
    return ""


def _stdout_closed() -> None:
    """The reader of stdout went away (``kvsim ... | head -1``): end quietly with 141, as a
    Unix tool that SIGPIPE ends does (a crash is 1); what the command wrote to files is whole
    (stdout is written last)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(128 + signal.SIGPIPE)


def _is_usage_error(e: Exception) -> bool:
    """A command-line usage error (bad option value, missing argument, unknown option): click's
    ``ClickException``, which recent typer versions vendor under ``typer.TyperException``."""
    import click
    return isinstance(e, (click.ClickException, typer.TyperException)) and \
        hasattr(e, "format_message") and hasattr(e, "exit_code")


if __name__ == "__main__":
    main()
