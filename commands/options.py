"""What the ``kvsim`` commands share: option groups defined once, and result output.

- An :class:`OptionGroup` is several options a command takes as one value (the trace reading
  options, the SLO targets, the run settings). A command names the group as the default of one
  parameter; :func:`with_groups` puts the group's options in that parameter's place (so
  ``--help`` lists them where they were) and calls the command with the group's value.
- Single options several commands take with the same flag, help and default are defined once
  here too (``JSON_OPTION``, ``SEED_OPTION``, the ``setting`` options of run settings).
- :func:`emit`: ``--json`` prints the machine-readable result, else a renderer prints it for
  people.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from typing import Any, Callable, Literal, Optional

import typer

from kvsim.workloads.options import TraceFormat

JSON_OPTION = typer.Option(False, "--json", help="Print the machine-readable result as JSON.")
SEED_OPTION = typer.Option(0, "--seed", min=0, help="Seed of every random draw.")


def emit(result: Any, as_json: bool, render=None) -> None:
    """Print ``result`` as JSON (``--json``) or through ``render`` for people."""
    if as_json:
        write_stdout(json.dumps(result, indent=2, sort_keys=True, default=_jsonable) + "\n")
    elif render is not None:
        render(result)


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout whole, or raise :class:`BrokenPipeError` when its reader has
    gone: a buffered write longer than the pipe holds was cut at 64 KiB with no error when
    the reader left (``--json | head -c 1`` ended with 0, the JSON silently incomplete)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):   # (not a file: a test's capture)
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    data = memoryview(text.encode(sys.stdout.encoding or "utf-8"))
    while data:
        data = data[os.write(fd, data):]


def _jsonable(value: Any):
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def progress(message: str) -> None:
    """Progress of the long real-backend commands, on stderr (stdout stays the result)."""
    typer.echo(f"kvsim: {message}", err=True)


def given_path(ctx: typer.Context, value: str | None) -> str | None:
    """An option callback: a path option given as an empty string is refused (it would mean
    the current directory, or nothing), and so is the next option taken as the path (``--out
    --limit 5``, ``--out -q``: ``./-q`` names such a path)."""
    if value is not None and not value.strip():
        raise typer.BadParameter("an empty path; give a file or directory")
    options = {o for param in ctx.command.params for o in param.opts if o.startswith("-")}
    if value is not None and (value.startswith("--") or value in options):
        raise typer.BadParameter(f"{value!r} is an option, not a path: give the path first "
                                 f"(./{value} for a path of that name)")
    return value


def opt(help_text: str, *names: str, **kwargs):
    """An option without a value of its own (None: not given)."""
    return typer.Option(None, *names, help=help_text, **kwargs)


# --- option groups ------------------------------------------------------------------------------

class OptionGroup:
    """Options (name -> ``(type, typer.Option)``, in ``--help`` order) that a command receives
    as one value: ``build`` of ``{name: value}``."""

    def __init__(self, options: dict[str, tuple[Any, Any]],
                 build: Callable[[dict], Any] = dict) -> None:
        self.options = options
        self.build = build

    def parameters(self) -> list[inspect.Parameter]:
        return [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  default=option, annotation=tp)
                for name, (tp, option) in self.options.items()]


def with_groups(command: Callable) -> Callable:
    """``command`` with each parameter whose default is an :class:`OptionGroup` expanded, in
    place, into the group's options; the command is called with the group's built value."""
    signature = inspect.signature(command, eval_str=True)
    params, groups = [], {}
    for param in signature.parameters.values():
        if isinstance(param.default, OptionGroup):
            groups[param.name] = param.default
            params += param.default.parameters()
        else:
            params.append(param)

    @functools.wraps(command)
    def expanded(**values):
        for name, group in groups.items():
            values[name] = group.build({key: values.pop(key) for key in group.options})
        return command(**values)

    expanded.__signature__ = signature.replace(parameters=params)
    expanded.__annotations__ = {p.name: p.annotation for p in params}
    return expanded


# --- reading a trace ----------------------------------------------------------------------------

FORMAT_OPTION = typer.Option(None, "--format", case_sensitive=False,
                             help="Trace format (kvsim, jsonl: native; azure-llm: azure).",
                             show_default="detected from the content")
LIMIT_OPTION = typer.Option(None, "--limit", min=1, help="Keep at most N requests.",
                            show_default="all")
START_OPTION = typer.Option(None, "--start", help="Keep requests arriving at or after this "
                            "many seconds after the trace's first request (the first that "
                            "--trace-model keeps and that did not fail).")
END_OPTION = typer.Option(None, "--end", help="Keep requests arriving before this many "
                          "seconds after the trace's first request (as for --start).")
RATE_SCALE_OPTION = typer.Option(1.0, "--rate-scale", help="Request-rate multiplier: 2 "
                                 "doubles the rate (inter-arrival gaps halved).")
SORT_OPTION = typer.Option(False, "--sort", help="Sort by arrival instead of rejecting "
                           "timestamps that go backwards.")
MODEL_OPTION = typer.Option(None, "--trace-model", "--model",
                            help="BurstGPT only: keep this model's rows (--trace-model, as "
                            "kvsim run names it; --model also works here).")
TRACE_MODEL_OPTION = typer.Option(None, "--trace-model",
                                  help="BurstGPT only: keep this model's rows.")


def trace_reading(rate_scale=(float, RATE_SCALE_OPTION), seed: bool = False,
                  model=None) -> OptionGroup:
    """The options that read a trace, built into ``TraceOptions`` keywords (a dict; the
    command adds ``seed`` where the group has none). ``rate_scale``: its ``(type, option)`` or
    None (no ``--rate-scale``, 1.0); ``seed``: a ``--seed`` option after ``--sort``;
    ``model``: the BurstGPT model filter's option, if any."""
    options = {"trace_format": (Optional[TraceFormat], FORMAT_OPTION),
               "trace_limit": (Optional[int], LIMIT_OPTION),
               "trace_start": (Optional[float], START_OPTION),
               "trace_end": (Optional[float], END_OPTION)}
    if rate_scale is not None:
        options["trace_rate_scale"] = rate_scale
    options["trace_sort"] = (bool, SORT_OPTION)
    if seed:
        options["trace_seed"] = (int, SEED_OPTION)
    if model is not None:
        options["trace_model"] = (Optional[str], model)
    return OptionGroup(options, _trace_keywords)


def _trace_keywords(v: dict) -> dict:
    """``TraceOptions`` keywords of a :func:`trace_reading` group's values (their parameter
    names start with ``trace_`` so they never clash with a command's own)."""
    keywords = dict(fmt=v["trace_format"], limit=v["trace_limit"], start_s=v["trace_start"],
                    end_s=v["trace_end"], rate_scale=v.get("trace_rate_scale", 1.0),
                    sort=v["trace_sort"], model_filter=v.get("trace_model"))
    if "trace_seed" in v:
        keywords["seed"] = v["trace_seed"]
    return keywords


def trace_options(reading: dict, **more):
    """The :class:`~kvsim.workloads.TraceOptions` of a :func:`trace_reading` group's value,
    checked: a bad one names its option (``--start``, not ``start_s``)."""
    from kvsim.errors import TraceError
    from kvsim.reports.frames import TRACE_OPTIONS
    from kvsim.workloads import TraceOptions
    try:
        return TraceOptions(**{**reading, **more}).checked()
    except TraceError as e:
        option = TRACE_OPTIONS.get(e.field, (None, e.field))[1]
        raise TraceError(e.message, location="command line", field=option) from None


# --- SLO targets --------------------------------------------------------------------------------

def _slo(values: dict) -> dict:
    """The targets, checked, an error naming the option (``--slo-ttft-p99``)."""
    from kvsim.errors import ConfigError
    from kvsim.sim.plan.spec import checked_slo
    try:
        return checked_slo({k: x for k, x in (("ttft_p99_s", values["slo_ttft_p99"]),
                                              ("tpot_p99_s", values["slo_tpot_p99"]))
                            if x is not None})
    except ConfigError as e:
        raise slo_option_error(e) from None


def slo_option_error(error):
    """An SLO target's or the planned load's error naming its option (``ttft_p99_s``:
    ``--slo-ttft-p99``; ``target_rate``: ``--target-rate``); any other error as it is."""
    from kvsim.errors import ConfigError
    from kvsim.sim.plan.spec import is_slo_key
    if error.field in ("target_rate", "rate_scale"):      # (the load, as plan sets it)
        return ConfigError(error.message, location=error.location or "command line",
                           field="--" + error.field.replace("_", "-"))
    if not is_slo_key(error.field):
        return error
    return ConfigError(error.message, location=error.location or "command line",
                       field=f"--slo-{error.field[:-2].replace('_', '-')}")


SLO_TARGETS = OptionGroup({
    "slo_ttft_p99": (Optional[float], opt("TTFT p99 target (s), drawn in the report.",
                                          "--slo-ttft-p99")),
    "slo_tpot_p99": (Optional[float], opt("TPOT p99 target (s), drawn in the report.",
                                          "--slo-tpot-p99")),
}, _slo)
"""The ``--slo-*`` targets given, keyed as the summary names them (checked)."""


# --- run settings (the RunConfig schema) --------------------------------------------------------

def setting(name: str, help_text: str, *names: str):
    """An option of run setting ``name`` whose shown default is the schema's
    (:class:`~kvsim.sim.config.RunConfig`); left unset (``None``) so a TOML file can set it."""
    from kvsim.sim.config import default_of
    default = default_of(name)
    shown = ("on" if default else "off") if isinstance(default, bool) else str(default)
    return typer.Option(None, *(names or ("--" + name.replace("_", "-"),)), help=help_text,
                        show_default="none" if default is None else shown)


NUM_CPU_BLOCKS_OPTION = setting(
    "num_cpu_blocks", "CPU KV offloading tier in blocks per replica (or --kv-offloading-size).")
KV_OFFLOADING_SIZE_OPTION = setting(
    "kv_offloading_size", "CPU KV offloading tier (vLLM's --kv-offloading-size): GiB of host "
    "memory per replica, all TP ranks together (vLLM splits it over the ranks).")
OFFLOAD_WRITE_OPTION = setting(
    "offload_write", "How blocks reach the CPU tier: native is vLLM v1's offloading connector "
    "(each block stored once computed; CPU hits load before the request runs). kvsim "
    "extensions that differ from vLLM v1: back (copy a cached block when the GPU evicts it) "
    "and through (copy each full block, hits promoted within the step).")
OFFLOAD_EVICTION_OPTION = setting(
    "offload_eviction_policy", "native: the CPU tier's eviction (vLLM's eviction_policy).")
OFFLOAD_STORE_THRESHOLD_OPTION = setting(
    "offload_store_threshold", "native: store a block only once it was offered this many "
    "times (vLLM's store_threshold; < 2: store all).")
PREEMPTION_MODE_OPTION = setting(
    "preemption_mode", "recompute (vLLM) or swap (kvsim extension, vLLM v1 has no swap: copy "
    "a preempted request's blocks to the CPU tier and back; needs --offload-write back or "
    "through).")
CPU_OFFLOAD_GB_OPTION = typer.Option(None, "--cpu-offload-gb", hidden=True,
                                     help="Refused: see --kv-offloading-size.")
MAX_MODEL_LEN_OPTION = setting(
    "max_model_len", "Longest sequence (none: the model's, capped by the pool).")
LONG_PROMPT_OPTION = setting(
    "long_prompt", "Prompts of max_model_len tokens or more: reject them (vLLM), or truncate "
    "every request whose prompt and output together pass max_model_len, both cut in "
    "proportion until they fit (Vidur).")

OutputFormat = Literal["csv", "parquet"]
