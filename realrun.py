"""``kvsim validate-real``: hold kvsim's prediction against a real vLLM run.

A real run is either a ``vllm bench serve --save-result --save-detailed`` file (per request
``input_lens``, ``output_lens``, ``ttfts``, ``itls``, optionally ``start_times``) or the output of
``../shared/tools/vllm-oracle/replay.py`` (``--timed`` for arrivals on the clock; its input trace
is needed for the requests' token ids and arrival times). kvsim replays the same requests with
the same engine settings and reports, per metric, the real value, kvsim's and the relative
error. :func:`fit_profile` fits the cost model's step terms to the oracle's measured steps and
returns a profile for ``kvsim run --profile``.

Clocks differ slightly: kvsim counts TTFT and E2E from a request's arrival; the oracle's
vLLM counts them from when its loop added the request, which happens between engine steps
(after the step in flight), so its latencies leave out up to one step of waiting.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.errors import ConfigError, KvsimError
from kvsim.reports.run_texts import deployment_text
from kvsim.realrun_checks import (bench_completed, bench_count, bench_duration, bench_starts,
                                   oracle_requests)
from kvsim.workloads import Request

#: The error table's rows: (name, unit).
METRICS = (("output throughput", "tok/s"), ("request throughput", "req/s"),
           *((f"{m} p{p}", "s") for m in ("TTFT", "TPOT", "E2E") for p in (50, 90, 99)))


@dataclass
class RealRun:
    """What a real run measured, and what kvsim needs to replay it."""

    label: str
    kind: str                       # "vllm bench serve" or "vllm-oracle"
    requests: list[Request]
    measured: pd.DataFrame          # per completed request: output_tokens, ttft_s, tpot_s, e2e_s
    duration_s: float
    settings: dict                  # kvsim run settings the run implies
    steps: pd.DataFrame | None = None   # oracle: per engine step features and wall_s
    trace_path: Path | None = None      # the trace it was read with, if any


def _load_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvsimError("no such file", location=str(path)) from None
    except (OSError, ValueError) as e:
        raise KvsimError(f"not a readable JSON result ({' '.join(str(e).split())})",
                         location=str(path)) from None
    if not isinstance(data, dict):
        raise KvsimError("expected a JSON object", location=str(path))
    return data


def read_real_run(path: str | os.PathLike, trace: str | os.PathLike | None = None) -> RealRun:
    """A :class:`RealRun` from a ``vllm bench serve`` result or a vllm-oracle replay; a
    malformed one is a one-line :class:`KvsimError` naming the file."""
    try:
        return _read_real_run(Path(path), trace)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        if isinstance(e, KvsimError):
            raise
        if isinstance(e, KeyError):
            raise KvsimError("missing from the result", location=str(path),
                             field=str(e.args[0])) from None
        raise KvsimError(f"malformed result ({' '.join(str(e).split())})",
                         location=str(path)) from None


def _read_real_run(p: Path, trace) -> RealRun:
    data = _load_json(p)
    if {"summary", "steps", "requests"} <= set(data):
        beside = p.parent / str(data["summary"].get("trace", ""))
        trace = trace if trace is not None else (beside if beside.is_file() else None)
        if trace is None:
            raise KvsimError("a vllm-oracle result needs its input trace (--trace FILE; "
                             f"{beside.name!r} is not beside it)", location=str(p),
                             field="trace")
        return _oracle_run(p, data, Path(trace))
    if {"input_lens", "output_lens", "ttfts", "itls"} <= set(data):
        return _bench_run(p, data, trace)
    raise KvsimError("neither a `vllm bench serve --save-result --save-detailed` file "
                     "(input_lens, output_lens, ttfts, itls) nor a vllm-oracle replay "
                     "(summary, steps, requests)", location=str(p))


def _trace_requests(trace: Path) -> list[Request]:
    """The trace's requests (a path, ``-`` for standard input or ``sample:NAME``)."""
    from kvsim.workloads import TraceOptions, read_trace
    from kvsim.workloads.sources import resolve_trace
    return read_trace(resolve_trace(str(trace))[0], TraceOptions(sort=True))


def _oracle_run(path: Path, data: dict, trace: Path) -> RealRun:
    if isinstance(data["requests"], list) and not data["requests"]:
        raise KvsimError("holds no request", location=str(path), field="requests")
    blocks = data["summary"]["settings"]["num_blocks"]
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 2:
        raise KvsimError(f"must be a whole number of at least 2 (block 0 is vLLM's null "
                         f"block), got {blocks!r}", location=str(path), field="num_blocks")
    rows = pd.DataFrame(oracle_requests(str(path), data))
    requests = _trace_requests(trace)
    if len(requests) != data["summary"].get("num_requests"):
        raise KvsimError(f"the trace has {len(requests)} requests, the replay "
                         f"{data['summary'].get('num_requests')}", location=str(trace))
    out = rows["output_tokens"]
    measured = pd.DataFrame({
        "request_id": rows["index"], "output_tokens": out, "ttft_s": rows["ttft_s"],
        "e2e_s": rows["e2e_s"],
        "tpot_s": ((rows["e2e_s"] - rows["ttft_s"]) / (out - 1)).where(out > 1)})
    return RealRun(path.name, "vllm-oracle", requests, measured,
                   float(data["summary"]["wall_s"]), oracle_settings(data["summary"]),
                   oracle_steps(data, requests), trace)


def oracle_settings(summary: dict) -> dict:
    """kvsim run settings of a vllm-oracle replay (its block 0 is vLLM's null block)."""
    s = summary["settings"]
    settings = dict(model="tiny-llama", block_size=s["block_size"],
                    num_gpu_blocks=s["num_blocks"] - 1, max_num_seqs=s["max_num_seqs"],
                    max_num_batched_tokens=s["max_num_batched_tokens"],
                    enable_prefix_caching=not s["no_prefix_caching"],
                    scheduling_policy="priority" if s["priority"] else "fcfs",
                    long_prefill_token_threshold=s.get("long_prefill_token_threshold", 0))
    if s.get("max_model_len"):
        settings["max_model_len"] = s["max_model_len"]
    return settings


def oracle_steps(data: dict, requests: list[Request]) -> pd.DataFrame:
    """Per engine step: requests, new tokens, KV tokens read (``sum c+q``), attention units
    (``sum q*(2c+q+1)``) as kvsim's cost model counts them, and the measured ``wall_s``. A
    request's computed tokens start at its cached tokens and restart after a preemption."""
    cached = {r["index"]: r["num_cached_tokens"] for r in data["requests"]}
    computed: dict[int, int] = {}
    rows = []
    for step in data["steps"]:
        for i in step.get("preempted", ()):
            computed.pop(int(i), None)
        seqs = tokens = kv = units = 0
        for key, n in step.get("scheduled", {}).items():
            i = int(key)
            c = computed.get(i, cached.get(i, 0))
            seqs, tokens, kv, units = seqs + 1, tokens + n, kv + c + n, units + n * (2 * c + n + 1)
            computed[i] = c + n
        rows.append((seqs, tokens, kv, units, float(step["wall_s"])))
    return pd.DataFrame(rows, columns=["seqs", "tokens", "kv_tokens", "attn_units", "wall_s"])


def _bench_run(path: Path, data: dict, trace) -> RealRun:
    n = bench_count(str(path), data)
    ok = bench_completed(str(path), data, n)
    if trace is not None:
        requests = _trace_requests(Path(trace))
    else:
        starts = bench_starts(str(path), data, n)
        starts = starts - starts.min() if n else starts
        requests = [Request(i, float(starts[i]), int(data["input_lens"][i]),
                            max(1, int(data["output_lens"][i]))) for i in range(n)]
    itl_sum = np.array([float(np.sum(x)) for x in data["itls"]])
    out = np.asarray(data["output_lens"], dtype=float)
    ttft = np.asarray(data["ttfts"], dtype=float)
    measured = pd.DataFrame({"request_id": np.arange(n), "output_tokens": out, "ttft_s": ttft,
                             "e2e_s": ttft + itl_sum,
                             "tpot_s": np.where(out > 1, itl_sum / np.maximum(out - 1, 1),
                                                np.nan)})[ok]
    return RealRun(path.name, "vllm bench serve", requests, measured,
                   bench_duration(str(path), data), _bench_settings(data),
                   trace_path=None if trace is None else Path(trace))


def _bench_settings(data: dict) -> dict:
    """The result's ``model_id`` as the model (checked by :func:`_check_model_id` unless the
    caller names one)."""
    model = data.get("model_id")
    return {"model": model} if isinstance(model, str) and model else {}


def _check_model_id(result: str, model: str | None, source: str) -> None:
    """A ``vllm bench serve`` result's ``model_id`` must name a model kvsim knows (catalog,
    Hugging Face cache, a config.json path) when no model is given: another model in its
    place would make every number of the table wrong. ``source``: the caller, whose way of
    giving a model the error names."""
    from kvsim.sim.perf.models import resolve_model
    give = "--model" if source == "command line" else 'settings={"model": ...}'
    if model is None:
        raise ConfigError(f"missing or empty: kvsim cannot tell which model ran; pass {give} "
                          "(a catalog name, a Hugging Face id or a config.json)",
                          location=result, field="model_id")
    try:
        resolve_model(model)
    except ConfigError:
        raise ConfigError(f"{model!r} is not a model kvsim knows (catalog, local Hugging Face "
                          f"cache or a config.json path); pass {give} with the model that "
                          "ran (`kvsim models` lists the catalog)",
                          location=result, field="model_id") from None


def _metric_values(duration: float, per_request: pd.DataFrame) -> list[float | None]:
    out = [per_request["output_tokens"].sum() / duration if duration else None,
           len(per_request) / duration if duration else None]
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        v = per_request[col].dropna().to_numpy()
        out += [float(np.percentile(v, p)) if len(v) else None for p in (50, 90, 99)]
    return out


def error_rows(real: RealRun, summary: dict, requests: pd.DataFrame) -> list[dict]:
    """Per metric: name, unit, the real value, kvsim's and kvsim's relative error."""
    done = requests[requests["completed"] == 1].rename(
        columns={"generated_tokens": "output_tokens_done"})
    done = done.assign(output_tokens=done["output_tokens_done"])
    ours = _metric_values(summary["duration_s"], done)
    theirs = _metric_values(real.duration_s, real.measured)
    rows = []
    for (name, unit), r, k in zip(METRICS, theirs, ours):
        err = (k - r) / r if r and k is not None else None
        rows.append({"metric": name, "unit": unit, "real": r, "kvsim": k, "error": err})
    return rows


def nonnegative_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: solve, drop the most negative term, solve
    again over the rest, until none is negative (a handful of terms: no solver needed)."""
    keep = list(range(X.shape[1]))
    while True:
        coef = np.zeros(X.shape[1])
        coef[keep] = np.linalg.lstsq(X[:, keep], y, rcond=None)[0]
        if coef.min() >= 0 or len(keep) == 1:
            return np.clip(coef, 0.0, None)
        keep.remove(int(np.argmin(coef)))


def fit_profile(real: RealRun, model) -> dict:
    """A fitted profile (``"kind": "fitted"``) whose step terms (per step, request, new token,
    KV token read, attention unit) are the non-negative least-squares fit of the oracle's
    measured step times; ``model`` is the :class:`ModelSpec` it was measured on."""
    from kvsim.sim.perf.profile import MODEL_SHAPE_KEYS
    if real.steps is None or real.steps.empty:
        raise KvsimError("fitting needs the engine steps of a vllm-oracle replay",
                         location=real.label, field="fit")
    s = real.steps
    X = np.column_stack([np.ones(len(s)), s["seqs"], s["tokens"], s["kv_tokens"],
                         s["attn_units"]]).astype(float)
    coef = nonnegative_lstsq(X, s["wall_s"].to_numpy(dtype=float))
    names = ("step_s", "per_seq_s", "per_token_s", "per_kv_token_s", "per_attn_unit_s")
    fitted = {k: float(v) for k, v in zip(names, coef)}
    fitted.update(host_copy_s_per_byte=0.0, device_copy_s_per_byte=0.0, copy_call_s=0.0)
    resid = X @ coef - s["wall_s"].to_numpy()
    return {"kind": "fitted", "gpu": "a100-80gb",
            "_source": f"kvsim validate-real --fit: least squares over the {len(s)} engine "
                       f"steps of {real.label} ({real.kind})",
            "_fit_rms_s": float(np.sqrt(np.mean(resid ** 2))),
            "fitted": fitted,
            "model_shape": {k: getattr(model, k) for k in MODEL_SHAPE_KEYS}}


def _cell(value, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:,.1f} ms" if unit == "s" else f"{value:,.1f}"


def render_error_table(rows: list[dict], title: str) -> str:
    """The rows as a text table (latencies in ms, throughputs per second)."""
    lines = [title, f"{'metric':<27}{'real':>12}{'kvsim':>12}{'error':>10}"]
    for r in rows:
        name = r["metric"] if r["unit"] == "s" else f"{r['metric']} ({r['unit']})"
        err = "—" if r["error"] is None else f"{100 * r['error']:+.1f}%"
        lines.append(f"{name:<27}{_cell(r['real'], r['unit']):>12}"
                     f"{_cell(r['kvsim'], r['unit']):>12}{err:>10}")
    return "\n".join(lines)


#: Profile sections whose times scale with the speed of the hardware (not communication).
SPEED_SECTIONS = ("gemm", "elementwise", "attention", "overhead")


def scaled_profile(gpu: str, factor: float) -> dict:
    """The GPU's default profile with every compute time ``factor`` times longer: its
    efficiencies divided by ``factor``, its fixed latencies and overheads multiplied."""
    from kvsim.sim.perf._catalog import profile_path
    from kvsim.sim.perf.gpus import resolve_gpu

    def scale(node: dict) -> dict:
        out = {}
        for key, value in node.items():
            if isinstance(value, dict):
                out[key] = scale(value)
            elif isinstance(value, (int, float)) and not key.startswith("_"):
                out[key] = value / factor if "efficiency" in key else value * factor
        return out
    base = json.loads(profile_path(resolve_gpu(gpu).name).read_text())
    return {**{k: scale(base[k]) for k in SPEED_SECTIONS}, "_speed_factor": factor,
            "_source": f"kvsim validate-real --fit: {gpu}'s profile, compute {factor:.4g}x "
                       "slower (fitted to the real run's median TPOT)"}


def fit_speed(real: RealRun, chosen: dict, path, iterations: int = 4) -> dict:
    """Fit one speed factor of the cost model to a real run without engine steps (a
    ``vllm bench serve`` result): TPOT scales with it, so a few fixed-point rounds
    ``factor *= real median TPOT / kvsim's`` settle it. Writes the profile to ``path``."""
    from kvsim.reports.io import write_json_atomic
    gpu = chosen.get("gpu") or "a100-80gb"
    factor, target = 1.0, float(real.measured["tpot_s"].median())
    for _ in range(iterations):
        write_json_atomic(path, scaled_profile(gpu, factor))
        r = _replay(real.requests, **{**chosen, "profile": str(path)})
        factor *= target / float(r.requests["tpot_s"].median())
    profile = scaled_profile(gpu, factor)
    write_json_atomic(path, profile)
    return profile


def validate_real(result: str | os.PathLike, trace: str | os.PathLike | None = None,
                  settings: dict | None = None, fit: str | os.PathLike | None = None,
                  source: str = "kvsim.validate_real") -> dict:
    """Replay a real run in kvsim; the error table, and with ``fit`` (a file to write) the
    fitted profile and the error table of a run with it. ``settings`` override the run's
    (a bad one is an error naming ``source``: the call, or the command line)."""
    from kvsim.api import checked_path, run_config
    from kvsim.reports.io import write_json_atomic
    from kvsim.output_file import check_output_file
    from kvsim.sim.perf.models import resolve_model
    for name, value in (("result", result), ("trace", trace), ("fit", fit)):
        if value is not None or name == "result":
            checked_path(value, name, source)
    if settings is not None and not isinstance(settings, dict):
        raise ConfigError(f"expected a dict of settings, got {type(settings).__name__}",
                          location=source, field="settings")
    if fit is not None:
        check_output_file(fit, "fit", reads=(result, trace))
    real = read_real_run(result, trace)
    if fit is not None:         # (and the trace found beside the result)
        check_output_file(fit, "fit", reads=(real.trace_path,))
    own = dict(real.settings)
    if "model" in (settings or {}):
        own.pop("model", None)
    elif real.kind == "vllm bench serve":
        _check_model_id(str(result), own.get("model"), source)
    run_config(real.label, own, source=str(result))  # (the run's own, then ours)
    chosen = {**real.settings, **(settings or {})}
    run_config(real.label, chosen, source=source)
    first = _replay(real.requests, **chosen)
    out = {"real": real.label, "kind": real.kind, "num_requests": len(real.requests),
           "settings": {k: first.summary["config"][k] for k in sorted(chosen)},
           "deployment": deployment_text(first.summary["config"]),
           "before": error_rows(real, first.summary, first.requests)}
    if fit is not None:
        if real.steps is None:
            profile = fit_speed(real, chosen, fit)
        else:
            profile = fit_profile(real, resolve_model(first.config.model))
            write_json_atomic(fit, profile)
        fitted = _replay(real.requests, **{**chosen, "profile": str(fit)})
        out.update(profile=str(fit), fitted_terms=profile.get("fitted") or {
                       "speed_factor": profile["_speed_factor"]},
                   after=error_rows(real, fitted.summary, fitted.requests))
    return out


def _replay(requests, **settings):
    """``kvsim.run`` of a replay, without its :class:`~kvsim.errors.KvsimWarning` (rejected
    requests: a replay of a real run compares them in its table; its caller is no
    ``kvsim.run`` user)."""
    import warnings
    from kvsim.api import run
    from kvsim.errors import KvsimWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KvsimWarning)
        return run(requests, **settings)


def render_validation(result: dict) -> str:
    """The terminal text of :func:`validate_real`."""
    head = f"{result['real']} ({result['kind']}, {result['num_requests']} requests)"
    text = f"kvsim ran {result['deployment']}\n" if result.get("deployment") else ""
    text += render_error_table(result["before"], f"kvsim vs {head}")
    if "after" in result:
        text += "\n\n" + render_error_table(result["after"], f"after fitting ({result['profile']})")
    return text
