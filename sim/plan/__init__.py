"""The capacity planner: candidates, latency floors, searches, the sweep backend."""
