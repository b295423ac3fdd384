"""Waiting queues: first-come-first-served, or by priority (lower value first)."""

from __future__ import annotations

import heapq
from collections import deque

from kvsim.cache.request_state import RequestState


class FCFSQueue:
    """Arrival order; a preempted request goes back to the front."""

    def __init__(self) -> None:
        self._queue: deque[RequestState] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self):
        return iter(self._queue)

    def add(self, seq: RequestState) -> None:
        self._queue.append(seq)

    def prepend(self, seq: RequestState) -> None:
        self._queue.appendleft(seq)

    def peek(self) -> RequestState:
        return self._queue[0]

    def pop(self) -> RequestState:
        return self._queue.popleft()


class PriorityQueue:
    """(priority, arrival, id) order; a preempted request simply rejoins the heap."""

    def __init__(self) -> None:
        self._heap: list[RequestState] = []

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return iter(sorted(self._heap))

    def add(self, seq: RequestState) -> None:
        heapq.heappush(self._heap, seq)

    prepend = add

    def peek(self) -> RequestState:
        return self._heap[0]

    def pop(self) -> RequestState:
        return heapq.heappop(self._heap)


def make_queue(policy: str):
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}: expected 'fcfs' or 'priority'")
