"""Which decoder the real backend builds for a ``--model`` name: catalog models and HF configs.

``kvsim.sim.models.resolve_model`` turns a catalog name, a Hugging Face id or a ``config.json``
path into a :class:`~kvsim.sim.models.ModelSpec`; :func:`resolve_backend_model` checks that the
architecture is one the backend implements (Llama-like: RMSNorm, RoPE, gated SiLU MLP, no
biases) and builds the matching :class:`~kvsim.real_backend.model.LlamaConfig`.

``tiny-llama`` names the bundled ``configs/tiny-llama.json`` (the vllm-oracle's 2-layer,
hidden-256 random Llama), so it works without ``../shared``.

This module does not import torch (``model.py`` does, but ``LlamaConfig`` is only built on demand).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.sim.models import ModelSpec, resolve_model

CONFIG_DIR = Path(__file__).parent / "configs"
BUNDLED = {"tiny-llama": CONFIG_DIR / "tiny-llama.json"}
LLAMA_LIKE = ("llama", "mistral")


@dataclass(frozen=True)
class BackendModel:
    """A model both sides understand: ``sim_model`` is what ``RunConfig.model`` and
    ``CostModel`` take (a catalog name or a config path), ``spec`` its architecture, and
    ``hf_config`` the raw ``config.json`` when there is one (for RoPE theta and norm eps)."""

    sim_model: str
    spec: ModelSpec
    hf_config: dict | None = None

    def llama_config(self):
        """The :class:`LlamaConfig` of this model (imports torch)."""
        from .model import LlamaConfig
        if self.hf_config is not None:
            return LlamaConfig.from_hf_dict(self.hf_config)
        return llama_config_from_spec(self.spec)


def require_torch() -> None:
    """Raise :class:`ConfigError` unless torch (the ``real`` extra) is importable."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConfigError("the real backend needs torch: pip install 'kvsim[real]'") from None


def llama_config_from_spec(spec: ModelSpec, rope_theta: float = 10000.0,
                           rms_eps: float = 1e-5):
    """A :class:`LlamaConfig` with ``spec``'s shape (catalog entries carry no RoPE theta or
    norm eps: they change values, not cost or KV size, so defaults are used)."""
    check_llama_like(spec)
    from .model import LlamaConfig
    return LlamaConfig(num_layers=spec.num_layers, hidden_size=spec.hidden_size,
                       num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                       head_dim=spec.head_dim, intermediate_size=spec.intermediate_size,
                       vocab_size=spec.vocab_size, rope_theta=rope_theta, rms_eps=rms_eps,
                       max_position=spec.max_model_len,
                       tie_word_embeddings=spec.tied_embeddings)


def check_llama_like(spec: ModelSpec) -> None:
    """Raise :class:`ConfigError` unless the backend can build ``spec`` faithfully."""
    problems = []
    if spec.family not in LLAMA_LIKE:
        problems.append(f"family '{spec.family}'")
    if not spec.gated_mlp:
        problems.append("a non-gated MLP")
    if spec.norm != "rmsnorm":
        problems.append(f"{spec.norm}")
    if spec.qkv_bias or spec.linear_bias:
        problems.append("linear biases")
    if spec.learned_positions:
        problems.append("learned positions")
    if problems:
        raise ConfigError(f"model '{spec.name}' has {', '.join(problems)}; the real backend "
                          f"builds Llama-like decoders only ({', '.join(LLAMA_LIKE)})",
                          field="model")


def resolve_backend_model(name_or_path: str | Path) -> BackendModel:
    """Resolve ``--model`` for the real backend (``tiny-llama``, a catalog name, an HF id, or
    a path to a ``config.json`` or a folder holding one)."""
    text = str(name_or_path)
    path = BUNDLED.get(text.lower(), Path(text))
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.suffix == ".json":
        spec = resolve_model(path)
        check_llama_like(spec)
        return BackendModel(str(path), spec, json.loads(path.read_text()))
    spec = resolve_model(text)
    check_llama_like(spec)
    return BackendModel(text, spec)
