"""The workload presets: chat, customer-service, rag, agent, sharegpt-like, long-doc.

Each preset is a frozen dataclass whose fields are its documented parameters; every field can
be changed with :func:`dataclasses.replace`. In all of them ``input_tokens`` is the *new* input
of a request (user message, question, tool result, or the whole prompt for sharegpt-like) and
``output_tokens`` what the model generates; ``kvsim gen --input-len / --output-len`` override
these two. ``rate`` is the default arrival rate of the preset's arrival unit (conversations,
agent tasks, or requests per second).

A preset turns arrival times into *sessions*: lists of :class:`Draft` requests, the first at the
session's start. Single-request presets make one-request sessions.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar, Iterator, Literal

import numpy as np

from kvsim.workloads.generators.lengths import Lengths, lognormal, uniform
from kvsim.workloads.generators.prompts import Keys, Segment


@dataclass
class Draft:
    """A request before numbering and hashing: its prompt as segments."""

    arrival_s: float
    segments: list[Segment]
    output_tokens: int
    session_id: str | None = None
    template_id: str | None = None
    priority: int = 0
    continues: "Draft | None" = None    # the earlier turn whose prompt + reply this resends

    @property
    def prompt_tokens(self) -> int:
        return sum(length for _, length in self.segments)


def zipf_weights(n: int, exponent: float) -> np.ndarray:
    """Popularity of ``n`` items, the ``k``-th (0-based) proportional to ``(k + 1) ** -exponent``."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    return w / w.sum()


@dataclass(frozen=True)
class Chat:
    """Multi-turn conversations. Every conversation starts with the shared system prompt
    (``system_tokens``); turn ``t``'s prompt is the system prompt plus all earlier user
    messages and replies plus the new user message, so each turn resends the previous turn's
    whole prompt and reply (it ``continues`` that request: the reply's KV blocks are the ones
    the previous turn generated). ``turns`` per conversation; the next turn arrives an exponential
    ``think_time_s`` (mean) after the previous one (reply time included). A conversation ends
    early when its prompt would pass ``max_context_tokens``. ``rate``: new conversations/s."""

    name: ClassVar[str] = "chat"
    shares_prefixes: ClassVar[bool] = True
    rate: float = 0.5
    system_tokens: int = 300
    turns: Lengths = uniform(2, 10)
    input_tokens: Lengths = lognormal(120, 1.0, 4, 2000)
    output_tokens: Lengths = lognormal(250, 0.8, 8, 2000)
    think_time_s: float = 20.0
    max_context_tokens: int = 32768

    def sessions(self, times, rng, keys: Keys) -> Iterator[list[Draft]]:
        system = (keys.new(), self.system_tokens)
        for number in itertools.count():
            yield self._conversation(f"chat-{number}", next(times), rng, keys, system)

    def _conversation(self, session, start, rng, keys, system) -> list[Draft]:
        history, drafts, t = [system], [], start
        for _ in range(self.turns.one(rng)):
            history.append((keys.new(), self.input_tokens.one(rng)))
            if sum(n for _, n in history) > self.max_context_tokens:
                break
            reply = self.output_tokens.one(rng)
            drafts.append(Draft(t, list(history), reply, session_id=session,
                                continues=drafts[-1] if drafts else None))
            history.append((keys.new(), reply))
            t += rng.exponential(self.think_time_s)
        return drafts


@dataclass(frozen=True)
class CustomerService:
    """Independent requests on ``num_templates`` system-prompt templates (lengths drawn once
    from ``template_tokens``: hundreds to thousands of tokens) chosen with Zipf popularity
    (``zipf_exponent``), each followed by a short user message. The scenario where prefix
    sharing matters most. ``rate``: requests/s."""

    name: ClassVar[str] = "customer-service"
    shares_prefixes: ClassVar[bool] = True
    rate: float = 2.0
    num_templates: int = 50
    template_tokens: Lengths = lognormal(1500, 0.6, 300, 6000)
    zipf_exponent: float = 1.1
    input_tokens: Lengths = lognormal(60, 0.7, 4, 1000)
    output_tokens: Lengths = lognormal(150, 0.7, 4, 1500)

    def sessions(self, times, rng, keys: Keys) -> Iterator[list[Draft]]:
        sizes = self.template_tokens.sample(rng, self.num_templates)
        templates = [(keys.new(), int(n)) for n in sizes]
        weights = zipf_weights(self.num_templates, self.zipf_exponent)
        for _ in itertools.count():
            k = int(rng.choice(self.num_templates, p=weights))
            question = (keys.new(), self.input_tokens.one(rng))
            yield [Draft(next(times), [templates[k], question], self.output_tokens.one(rng),
                         template_id=f"template-{k}")]


@dataclass(frozen=True)
class Rag:
    """Retrieval-augmented generation: a shared system prompt (``system_tokens``), then
    ``docs_per_request`` distinct documents from a pool of ``num_documents`` (lengths from
    ``document_tokens``, drawn once; retrieval popularity Zipf with ``zipf_exponent``, most
    relevant first), then the question (``input_tokens``). ``rate``: requests/s."""

    name: ClassVar[str] = "rag"
    shares_prefixes: ClassVar[bool] = True
    rate: float = 2.0
    system_tokens: int = 150
    num_documents: int = 500
    document_tokens: Lengths = lognormal(700, 0.4, 100, 3000)
    docs_per_request: int = 4
    zipf_exponent: float = 0.9
    input_tokens: Lengths = lognormal(40, 0.6, 4, 500)
    output_tokens: Lengths = lognormal(200, 0.6, 8, 1500)

    def sessions(self, times, rng, keys: Keys) -> Iterator[list[Draft]]:
        system = (keys.new(), self.system_tokens)
        docs = [(keys.new(), int(n)) for n in self.document_tokens.sample(rng, self.num_documents)]
        weights = zipf_weights(self.num_documents, self.zipf_exponent)
        for _ in itertools.count():
            picked = rng.choice(self.num_documents, size=self.docs_per_request, replace=False,
                                p=weights)
            question = (keys.new(), self.input_tokens.one(rng))
            segments = [system, *(docs[int(d)] for d in picked), question]
            yield [Draft(next(times), segments, self.output_tokens.one(rng))]


@dataclass(frozen=True)
class Agent:
    """Tool-using agents. A task starts from one of ``num_toolsets`` system prompts with tool
    descriptions (``toolset_tokens``, Zipf ``zipf_exponent``) plus the task (``task_tokens``).
    Each of ``steps`` model calls outputs a tool call (``output_tokens``; the last call the
    final answer, ``final_tokens``); the next call's prompt is the previous prompt plus that
    tool call (the blocks the previous call generated: it ``continues`` it) plus the tool's
    result (``input_tokens``), arriving an exponential
    ``tool_time_s`` (mean) later. A task ends early past ``max_context_tokens``.
    ``rate``: new tasks/s."""

    name: ClassVar[str] = "agent"
    shares_prefixes: ClassVar[bool] = True
    rate: float = 0.2
    num_toolsets: int = 5
    toolset_tokens: Lengths = lognormal(2000, 0.5, 500, 8000)
    zipf_exponent: float = 1.0
    task_tokens: Lengths = lognormal(150, 0.8, 8, 2000)
    steps: Lengths = uniform(3, 12)
    input_tokens: Lengths = lognormal(400, 1.0, 10, 8000)
    output_tokens: Lengths = lognormal(80, 0.5, 8, 500)
    final_tokens: Lengths = lognormal(300, 0.6, 16, 2000)
    tool_time_s: float = 3.0
    max_context_tokens: int = 65536

    def sessions(self, times, rng, keys: Keys) -> Iterator[list[Draft]]:
        sizes = self.toolset_tokens.sample(rng, self.num_toolsets)
        toolsets = [(keys.new(), int(n)) for n in sizes]
        weights = zipf_weights(self.num_toolsets, self.zipf_exponent)
        for number in itertools.count():
            k = int(rng.choice(self.num_toolsets, p=weights))
            yield self._task(f"agent-{number}", next(times), rng, keys, toolsets[k], k)

    def _task(self, session, start, rng, keys, toolset, k) -> list[Draft]:
        prompt = [toolset, (keys.new(), self.task_tokens.one(rng))]
        drafts, t, steps = [], start, self.steps.one(rng)
        for step in range(steps):
            if sum(n for _, n in prompt) > self.max_context_tokens:
                break
            out = (self.final_tokens if step == steps - 1 else self.output_tokens).one(rng)
            drafts.append(Draft(t, list(prompt), out, session_id=session,
                                template_id=f"toolset-{k}",
                                continues=drafts[-1] if drafts else None))
            prompt += [(keys.new(), out), (keys.new(), self.input_tokens.one(rng))]
            t += rng.exponential(self.tool_time_s)
        return drafts


@dataclass(frozen=True)
class ShareGptLike:
    """Independent single-turn requests with ShareGPT-like lengths (lognormal, means ~161
    input / ~338 output tokens, long tails), sharing no prefix. ``rate``: requests/s."""

    name: ClassVar[str] = "sharegpt-like"
    shares_prefixes: ClassVar[bool] = False
    rate: float = 4.0
    input_tokens: Lengths = lognormal(161, 1.0, 4, 4096)
    output_tokens: Lengths = lognormal(338, 1.0, 4, 4096)

    def sessions(self, times, rng, keys: Keys) -> Iterator[list[Draft]]:
        for _ in itertools.count():
            prompt = [(keys.new(), self.input_tokens.one(rng))]
            yield [Draft(next(times), prompt, self.output_tokens.one(rng))]


@dataclass(frozen=True)
class LongDoc:
    """Questions about long documents (books, code bases, contracts, long transcripts):
    ``num_documents`` documents (lengths from ``document_tokens``, drawn once), each asked about
    again and again. A request is one document, chosen uniformly at random, then a question
    (``input_tokens``). Together the documents hold far more KV than one GPU does: the
    long-context workload a host (CPU) KV tier is meant for. ``rate``: requests/s."""

    name: ClassVar[str] = "long-doc"
    shares_prefixes: ClassVar[bool] = True
    rate: float = 0.05
    num_documents: int = 12
    document_tokens: Lengths = uniform(80_000, 100_000)
    input_tokens: Lengths = lognormal(60, 0.7, 4, 1000)
    output_tokens: Lengths = lognormal(200, 0.6, 8, 1500)

    def sessions(self, times, rng, keys: Keys) -> Iterator[list[Draft]]:
        sizes = self.document_tokens.sample(rng, self.num_documents)
        documents = [(keys.new(), int(n)) for n in sizes]
        for _ in itertools.count():
            k = int(rng.integers(self.num_documents))
            question = (keys.new(), self.input_tokens.one(rng))
            yield [Draft(next(times), [documents[k], question], self.output_tokens.one(rng),
                         template_id=f"document-{k}")]


PRESETS = {p.name: p for p in (Chat(), CustomerService(), Rag(), Agent(), ShareGptLike(),
                               LongDoc())}
"""The presets by name, with their default parameters."""
#: The preset names, as a type (the CLI's choices).
PresetName = Literal[tuple(PRESETS)]
