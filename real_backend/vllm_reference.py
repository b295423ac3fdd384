"""Step times of kvsim's backend next to vLLM's, on the vllm-oracle fixtures.

``tests/fixtures/vllm/NAME.jsonl`` are token-id traces that real vLLM 0.32 (CPU build, the
oracle's tiny Llama, float32, 1 thread) replayed; ``NAME.vllm.json`` holds its decisions and
``summary.mean_step_s``. This replays each trace with the same settings and the same arrival
clock as the oracle (``replay_stepped.py``: requests join at integer ``arrival_step``; offline
traces all at step 0), each step executed by a :class:`TorchExecutor` on the bundled
``tiny-llama`` config, and reports the mean step time both ways: the executor's (forward, copies,
sampling) and the whole iteration's (plus scheduling, as vLLM's step wall time includes).

    python -m kvsim.real_backend.vllm_reference [--fixtures DIR] [--out FILE] [--threads 1]

Fixtures recorded on another tiny config (``summary.model``, issue 19) are skipped.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from kvsim.sim.serving.vllm_fixture import load_fixture, replay_fixture

from kvsim.real_backend.torch_executor import TorchExecutor
from kvsim.real_backend.session import BackendSettings, build_runner, device_name, prepare_device, warm_up

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm"


def on_tiny_llama(path: Path) -> bool:
    """Whether fixture ``path`` was recorded on the oracle's tiny Llama (the issue-19 fixtures
    name another tiny config in ``summary.model``; this backend runs the tiny Llama only)."""
    return load_fixture(path)[1]["summary"].get("model", "tiny-llama") == "tiny-llama"


def replay(path: Path, settings: BackendSettings) -> dict:
    """Replay one fixture on the real backend; step counts and mean step times."""
    reqs, oracle = load_fixture(path)
    s = oracle["summary"]["settings"]
    model = prepare_device(settings)
    runner = build_runner(settings, model, s["num_blocks"] - 1)
    warm_up(runner, s["max_num_seqs"])
    executor = TorchExecutor(runner, [r for _, r in reqs], clock=settings.clock)
    executed, wall, cpu = [], [], []

    def step(sched) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        executed.append(executor.step_duration(sched.schedule()))
        sched.update_from_output()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)

    replay_fixture(reqs, s, step)
    return {"fixture": path.name, "steps": len(executed),
            "vllm_steps": oracle["summary"]["engine_steps"],
            "vllm_mean_step_s": oracle["summary"]["mean_step_s"],
            "kvsim_mean_executor_step_s": float(np.mean(executed)),
            "kvsim_mean_iteration_wall_s": float(np.mean(wall)),
            "kvsim_mean_iteration_cpu_s": float(np.mean(cpu))}


def render(rows: list[dict]) -> str:
    lines = [f"{'fixture':<26}{'steps':>7}{'vLLM s/step':>13}{'kvsim exec':>12}"
             f"{'kvsim iter':>12}{'iter/vLLM':>11}"]
    for r in rows:
        ratio = r["kvsim_mean_iteration_wall_s"] / r["vllm_mean_step_s"]
        lines.append(f"{r['fixture']:<26}{r['steps']:>7}{r['vllm_mean_step_s']:>13.4f}"
                     f"{r['kvsim_mean_executor_step_s']:>12.4f}"
                     f"{r['kvsim_mean_iteration_wall_s']:>12.4f}{ratio:>10.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixtures", default=str(FIXTURES))
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", default="wall")
    a = p.parse_args(argv)
    settings = BackendSettings(threads=a.threads, clock=a.clock)
    rows = [replay(f, settings) for f in sorted(Path(a.fixtures).glob("*.jsonl"))
            if on_tiny_llama(f)]
    print(render(rows))
    if a.out:
        from kvsim.reports.io import write_json_atomic
        write_json_atomic(a.out, {"device_name": device_name("cpu"), "settings":
                                  settings.to_dict(), "rows": rows})
    return rows


if __name__ == "__main__":
    main()
