"""Which decoder the real backend builds for a ``--model`` name, and its shape.

``kvsim.sim.perf.models.resolve_model`` turns a catalog name, a Hugging Face id or a ``config.json``
path into a :class:`~kvsim.sim.perf.model_shape.ModelSpec`; :func:`resolve_backend_model` checks that
the architecture is one the backend implements (Llama-like: RMSNorm, RoPE, gated SiLU MLP, no
biases). :class:`LlamaConfig` is what :mod:`.llama` builds: that same ``ModelSpec`` (the one
model-shape definition) plus the two constants that change values, never cost or KV size.

``tiny-llama`` names the bundled config of the vllm-oracle's 2-layer, hidden-256 random Llama
(:data:`~kvsim.sim.perf.models.BUNDLED_CONFIGS`: the simulator knows it by that name too), so it
works without ``../shared``.

This module does not import torch (:mod:`.llama` does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.sim.perf.arch import model_from_hf_dict
from kvsim.sim.perf.models import BUNDLED_CONFIGS, ModelSpec, resolve_model

LLAMA_LIKE = ("llama", "mistral")


@dataclass(frozen=True)
class BackendModel:
    """A model both sides understand: ``sim_model`` is what ``RunConfig.model`` and
    ``CostModel`` take (a catalog name or a config path), ``spec`` its architecture, and
    ``hf_config`` the raw ``config.json`` when there is one (for RoPE theta and norm eps)."""

    sim_model: str
    spec: ModelSpec
    hf_config: dict | None = None

    def llama_config(self) -> "LlamaConfig":
        """The :class:`LlamaConfig` of this model."""
        if self.hf_config is not None:
            return LlamaConfig.from_hf_dict(self.hf_config)
        return LlamaConfig(self.spec)


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama-architecture decoder the real backend builds: ``shape`` (the
    simulator's :class:`ModelSpec`, so both sides size the same model) plus RoPE theta and the
    RMSNorm epsilon (catalog entries carry neither: they change values, not cost or KV size)."""

    shape: ModelSpec
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5

    def __post_init__(self) -> None:
        s = self.shape
        if s.num_heads % s.num_kv_heads:
            raise ValueError(f"num_heads={s.num_heads} is not a multiple of "
                             f"num_kv_heads={s.num_kv_heads}")
        if s.head_dim % 2:
            raise ValueError(f"head_dim={s.head_dim} must be even for RoPE")

    num_layers = property(lambda self: self.shape.num_layers)
    hidden_size = property(lambda self: self.shape.hidden_size)
    num_heads = property(lambda self: self.shape.num_heads)
    num_kv_heads = property(lambda self: self.shape.num_kv_heads)
    head_dim = property(lambda self: self.shape.head_dim)
    intermediate_size = property(lambda self: self.shape.intermediate_size)
    vocab_size = property(lambda self: self.shape.vocab_size)
    q_size = property(lambda self: self.shape.q_size)
    kv_size = property(lambda self: self.shape.kv_size)
    #: Longest position the RoPE tables are first built for (the model's max length).
    max_position = property(lambda self: self.shape.max_model_len)
    tie_word_embeddings = property(lambda self: self.shape.tied_embeddings)

    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head (1 = multi-head attention)."""
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype: str = "fp32") -> int:
        """Bytes of K and V one token occupies across all layers."""
        return self.shape.kv_bytes_per_token(dtype)

    @classmethod
    def from_hf_dict(cls, d: dict, location: str = "config.json") -> "LlamaConfig":
        """From a Hugging Face ``config.json`` dict, read by the simulator's reader (RoPE
        theta and norm eps taken from it too; ``rope_scaling`` changes frequencies, not cost
        or KV shape, and is ignored)."""
        shape = model_from_hf_dict(d, Path(location))
        return cls(shape, rope_theta=float(d.get("rope_theta", 10000.0)),
                   rms_eps=float(d.get("rms_norm_eps", 1e-5)))

    @classmethod
    def from_json(cls, path: str | Path) -> "LlamaConfig":
        """Read a Hugging Face ``config.json`` file."""
        return cls.from_hf_dict(json.loads(Path(path).read_text()), str(path))


def require_torch() -> None:
    """Raise :class:`ConfigError` unless torch (the ``real`` extra) is importable."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConfigError("the real backend needs torch: pip install 'kvsim[real]'") from None


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
    if any(kind != "full" for kind in spec.layer_kinds):
        problems.append("sliding-window or chunked attention layers (the backend's attend "
                        "to every token)")
    if spec.weight_dtype:
        problems.append(f"{spec.weight_dtype} weights (quantization_config; the backend "
                        "builds them unquantized)")
    if problems:
        raise ConfigError(f"model '{spec.name}' has {', '.join(problems)}; the real backend "
                          f"builds Llama-like decoders ({', '.join(LLAMA_LIKE)}) with full "
                          "attention and unquantized weights only", field="model")


def resolve_backend_model(name_or_path: str | Path) -> BackendModel:
    """Resolve ``--model`` for the real backend (``tiny-llama``, a catalog name, an HF id, or
    a path to a ``config.json`` or a folder holding one)."""
    text = str(name_or_path)
    bundled = BUNDLED_CONFIGS.get(text.lower())
    path = bundled or Path(text)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.suffix == ".json":
        spec = resolve_model(text.lower() if bundled else path)
        check_llama_like(spec)
        return BackendModel(text.lower() if bundled else str(path), spec,
                            json.loads(path.read_text()))
    spec = resolve_model(text)
    check_llama_like(spec)
    return BackendModel(text, spec)
