"""Small Llama shapes for the real-backend tests, built the one way the package builds them:
a :class:`~kvsim.sim.perf.model_shape.ModelSpec` wrapped in a
:class:`~kvsim.real_backend.backend_model.LlamaConfig`."""

from kvsim.real_backend.backend_model import LlamaConfig
from kvsim.sim.perf.model_shape import ModelSpec


def llama(rope_theta: float = 10000.0, max_model_len: int = 4096, **dims) -> LlamaConfig:
    """A Llama-like :class:`LlamaConfig` of the given dimensions (``num_layers``,
    ``hidden_size``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``intermediate_size``,
    ``vocab_size``)."""
    return LlamaConfig(ModelSpec(name="test-llama", max_model_len=max_model_len, **dims),
                       rope_theta=rope_theta)
