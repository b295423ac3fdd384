"""The weight storage of a quantized checkpoint, from its ``config.json``'s
``quantization_config`` (as vLLM picks its ``--quantization`` from it): the weight dtype
kvsim prices (``int4``, ``int8``, ``fp8``) when ``--weight-dtype`` is not given.

- ``awq``, ``gptq`` (and their marlin kernels): ``bits`` (AWQ's ``w_bit``; 4 unless given),
  integer groups; 2 and 3 bits are counted as 4 (their packing is not modelled: a little
  more memory than they take, never less);
- ``mxfp4`` (gpt-oss): 4-bit, counted as ``int4``;
- ``fp8``, ``fbgemm_fp8``: ``fp8``; ``modelopt`` by its ``quant_algo`` (``FP8``, or
  ``NVFP4`` counted as ``int4``);
- ``bitsandbytes``: ``load_in_4bit`` / ``load_in_8bit``;
- ``compressed-tensors``: the weights' ``num_bits`` of its first config group (``fp8`` for
  8-bit floats).

Any other method is refused: its weights' size is unknown, and guessing bf16 sized a
4-bit 70B model at 131 GiB.

``modules_to_not_convert`` names modules the checkpoint keeps 16-bit: a name for every layer
(a wildcard, or no layer number) ending in ``self_attn`` / ``attn`` / ``attention`` keeps the
attention projections, one ending in ``router`` or ``gate`` (a MoE router) the routers
(gpt-oss keeps both). Names of one layer, of the embeddings or LM head (16-bit anyway) or of
parts kvsim does not model (a vision tower) change nothing.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import ConfigError

_GROUPED = ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin", "gptq_marlin_24")
_FP8 = ("fp8", "fbgemm_fp8", "ptpc_fp8")


def checkpoint_weight_dtype(cfg: dict, path: Path) -> str | None:
    """The weight dtype of the checkpoint whose config is ``cfg`` (None: not quantized)."""
    quant = cfg.get("quantization_config")
    if quant is None:
        return None
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    found = _by_method(method, quant) if method else None
    if found is None:
        known = (*_GROUPED, "mxfp4", *_FP8, "modelopt", "bitsandbytes", "compressed-tensors")
        what = (f"{method!r} with these settings (kvsim sizes 2-, 3-, 4- and 8-bit integer, "
                "FP8 and FP4 weights)" if method in known else
                f"quant_method {method or '(none)'!r} (known: {', '.join(known)})")
        raise ConfigError(f"{what} is not one kvsim can size: remove quantization_config and "
                          "give --weight-dtype", location=str(path), field="quantization_config")
    return found


#: The layer parts a checkpoint may keep 16-bit, by the last module name that names them.
_KEPT_PARTS = {"self_attn": "attention", "attn": "attention", "attention": "attention",
               "router": "router", "gate": "router"}


def kept_16bit(cfg: dict) -> tuple[str, ...]:
    """The layer parts (``attention``, ``router``) the quantized checkpoint whose config is
    ``cfg`` keeps 16-bit in every layer: its ``modules_to_not_convert`` (see the module doc)."""
    quant = cfg.get("quantization_config")
    names = quant.get("modules_to_not_convert") if isinstance(quant, dict) else None
    if not isinstance(names, list):
        return ()
    parts = []
    for name in names:
        path = str(name).split(".")
        if not any(part.isdigit() for part in path) and path[-1] in _KEPT_PARTS:
            parts.append(_KEPT_PARTS[path[-1]])
    return tuple(sorted(set(parts)))


def _by_method(method: str, quant: dict) -> str | None:
    if method in _GROUPED:
        return _int_bits(quant.get("bits", quant.get("w_bit", 4)))
    if method == "mxfp4":
        return "int4"
    if method in _FP8:
        return "fp8"
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "FP8")).upper()
        return "fp8" if algo == "FP8" else "int4" if algo in ("NVFP4", "FP4") else None
    if method == "bitsandbytes":
        return "int4" if quant.get("load_in_4bit") else "int8" if quant.get("load_in_8bit") \
            else None
    if method == "compressed-tensors":
        return _compressed(quant)
    return None


def _compressed(quant: dict) -> str | None:
    groups = quant.get("config_groups")
    first = next(iter(groups.values()), None) if isinstance(groups, dict) and groups else None
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(weights, dict):
        return None
    if weights.get("type") == "float" and weights.get("num_bits") == 8:
        return "fp8"
    return _int_bits(weights.get("num_bits"))


def _int_bits(bits) -> str | None:
    return {2: "int4", 3: "int4", 4: "int4", 8: "int8"}.get(bits)
