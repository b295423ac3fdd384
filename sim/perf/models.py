"""Models by name: the catalog in ``catalog/models.json`` and ``catalog/hf_models.json``,
Hugging Face ids in the local cache, and paths to a ``config.json``.

Each resolves to a :class:`~kvsim.sim.perf.model_shape.ModelSpec` (re-exported here with the dtype
helpers, the names the rest of :mod:`kvsim.sim` imports); Hugging Face configs are read by
:mod:`kvsim.sim.perf.arch`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.sim.perf._catalog import close_matches, load_catalog
from kvsim.sim.perf.arch import model_from_hf_config, spec_from_hf
from kvsim.sim.perf.model_shape import (DTYPE_BYTES, WEIGHT_DTYPE_BYTES, ModelSpec,  # noqa: F401
                                   dtype_bytes, weight_dtype_bytes)

__all__ = ["DTYPE_BYTES", "WEIGHT_DTYPE_BYTES", "ModelSpec", "check_tensor_parallel",
           "dtype_bytes", "list_models", "resolve_model", "weight_dtype_bytes"]


#: Configs kvsim ships that are no catalog entry, by name: the real backend's test model (the
#: vllm-oracle's random 2-layer, hidden-256 Llama), so a profile measured on it runs by name.
BUNDLED_CONFIGS = {"tiny-llama": Path(__file__).parent / "catalog" / "tiny-llama.json"}


def _from_entry(name: str, entry: dict) -> ModelSpec:
    fields = {k: v for k, v in entry.items() if k != "aliases"}
    return ModelSpec(name=name, aliases=tuple(entry.get("aliases", ())), **fields)


def list_models() -> list[str]:
    """Model names, sorted: the catalog's (``models.json`` and the Hugging Face configs of
    ``hf_models.json``) and the bundled configs'."""
    return sorted([*load_catalog("models.json")["models"],
                   *load_catalog("hf_models.json")["models"], *BUNDLED_CONFIGS])


def resolve_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog name (``llama-2-7b``), a bundled config (:data:`BUNDLED_CONFIGS`), a Hugging
    Face id (``meta-llama/Llama-2-7b-hf``, case ignored) or a path to a Hugging Face
    ``config.json`` (or a folder holding one)."""
    text = str(name_or_path)
    if text.lower() in BUNDLED_CONFIGS:
        return replace(model_from_hf_config(BUNDLED_CONFIGS[text.lower()]), name=text.lower())
    path = Path(text)
    if path.suffix == ".json" or (path / "config.json").is_file():
        return model_from_hf_config(path / "config.json" if path.is_dir() else path)
    models = load_catalog("models.json")["models"]
    hf_models = load_catalog("hf_models.json")["models"]
    index = {}
    index.update({k: k for k in BUNDLED_CONFIGS})      # (for the hint of an unknown name)
    for catalog in (models, hf_models):
        index.update({k.lower(): k for k in catalog})
        for key, entry in catalog.items():
            index.update({a.lower(): key for a in entry.get("aliases", ())})
    key = index.get(text.lower())
    if key is None:
        return _from_hub_cache(text, index, list_models())
    if key in hf_models:
        entry = hf_models[key]
        return spec_from_hf(key, entry["config"], f"catalog hf_models.json:{key}",
                            tuple(entry.get("aliases", ())))
    return _from_entry(key, models[key])


def _from_hub_cache(text: str, index: dict, known: list[str]) -> ModelSpec:
    """A Hugging Face id that is no catalog alias, from the local Hugging Face cache."""
    from kvsim.sim.perf.hf_cache import cached_config, hub_cache_dir, is_repo_id
    config = cached_config(text) if is_repo_id(text) else None
    if config is not None:
        spec = model_from_hf_config(config)
        return spec if spec.name == text else replace(spec, name=text)
    hint = close_matches(text.lower(), index)
    cache = (f", not in the local Hugging Face cache ({hub_cache_dir()}; `huggingface-cli "
             f"download {text} config.json` puts it there)") if is_repo_id(text) else ""
    raise ConfigError(f"unknown model '{text}'{hint}{cache}; known: "
                      f"{', '.join(known)}, a Hugging Face id in the local cache, "
                      "or a path to a Hugging Face config.json", field="model")


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """vLLM's rules: the attention heads divide evenly over the ``tp`` GPUs, and the KV heads
    either divide evenly too or are replicated (``tp`` a multiple of their count)."""
    if model.num_heads % tp:
        raise ConfigError(f"{model.name} has {model.num_heads} attention heads, which do not "
                          f"divide over {tp} GPUs (vLLM refuses this)", field="tp")
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ConfigError(f"{model.name} has {kv} KV heads: tp must divide them or be a "
                          f"multiple of them, got {tp} (vLLM refuses this)", field="tp")
