"""kvsim: a discrete-event simulator and capacity planner for the KV cache of LLM serving engines."""

__version__ = "0.1.0"
