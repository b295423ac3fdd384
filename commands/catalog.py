"""``kvsim models`` and ``kvsim gpus``: the catalogs that ``--model`` and ``--gpu`` name."""

from __future__ import annotations

import typer

from kvsim.commands.options import JSON_OPTION, emit


def models_command(as_json: bool = JSON_OPTION) -> None:
    """List the catalog's models: the names `kvsim run --model` takes (a Hugging Face id in
    the local cache or a config.json path works too)."""
    from kvsim.sim.perf.models import list_models, resolve_model
    rows = []
    for name in list_models():
        m = resolve_model(name)
        rows.append({"name": m.name, "family": m.family, "num_params": m.num_params,
                     "active_params": m.active_params, "num_layers": m.num_layers,
                     "attention": "mla" if m.is_mla else
                     "mha" if m.num_kv_heads == m.num_heads else "gqa",
                     "max_model_len": m.max_model_len,
                     "kv_bytes_per_token": m.kv_bytes_per_token("bf16")})
    emit(rows, as_json, lambda r: typer.echo(_table(
        ("model", "params", "active", "layers", "attn", "max len", "KV/token"),
        [(m["name"], _billions(m["num_params"]), _billions(m["active_params"]),
          str(m["num_layers"]), m["attention"], f"{m['max_model_len']:,}",
          f"{m['kv_bytes_per_token'] / 1024:,.0f} KiB") for m in r])
        + "\nactive: parameters used per token; KV/token: its cache over all layers, bf16"))


def gpus_command(as_json: bool = JSON_OPTION) -> None:
    """List the catalog's GPUs: the names `kvsim run --gpu` takes (aliases such as h100
    work too)."""
    from kvsim.sim.perf.gpus import list_gpus, resolve_gpu
    rows = []
    for name in list_gpus():
        g = resolve_gpu(name)
        rows.append({"name": g.name, "display_name": g.display_name,
                     "memory_bytes": g.memory_bytes,
                     "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s,
                     "dense_bf16_flops": g.dense_bf16_flops,
                     "interconnect": g.interconnect_type,
                     "price_per_hour_usd": g.price_per_hour_usd, "aliases": list(g.aliases)})
    emit(rows, as_json, lambda r: typer.echo(_table(
        ("gpu", "memory", "HBM", "bf16", "link", "$/hour"),
        [(g["name"], f"{g['memory_bytes'] / 2**30:,.2f} GiB",
          f"{g['hbm_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s",
          f"{g['dense_bf16_flops'] / 1e12:,.0f} TFLOP/s", g["interconnect"],
          "—" if g["price_per_hour_usd"] is None else f"{g['price_per_hour_usd']:.2f}")
         for g in r])))


def _billions(n: int) -> str:
    return f"{n / 1e9:,.1f}B"


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Left-aligned words, right-aligned numbers, two spaces between columns."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    words = {i for i in range(len(headers)) if not any(c[:1].isdigit() for c in
                                                        (r[i] for r in rows))}

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i in words else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(headers), *map(line, rows)])
