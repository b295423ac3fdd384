"""Old name of :mod:`kvsim.real_backend.model_runner`, kept only because
:mod:`kvsim.real_backend.executor` (owned by another branch now) imports it from here; the lead
points that import at ``model_runner`` and deletes this file after merging."""

from .model_runner import ModelRunner, RequestChunk  # noqa: F401
