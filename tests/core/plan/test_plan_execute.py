"""Serial, local processes and Ray give identical plans; the cache returns them exactly, survives an
interruption, and ignores what it cannot trust."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.plan.cache import PointCache, point_key
from kvcalc.core.plan.execute import run_points
from kvcalc.core.plan.planner import run_plan
from kvcalc.core.plan.space import Space, point_options


def _small(cases):
    """8 points (4 pruned or missed quickly, 4 searched) over the hand-checked workload."""
    return replace(cases.HAND_REQUEST, space=Space(gpus=("A100-80GB", "H100-SXM"), tp=(1, 4), replicas=(1, 2)))


def _points(result):
    return [{k: v for k, v in p.items() if k != "point"} for p in result.points]


@pytest.fixture(scope="module")
def serial(cases):
    return run_plan(_small(cases))


def test_two_local_processes_give_the_serial_plan(cases, serial):
    parallel = run_plan(_small(cases), jobs=2)
    assert _points(parallel) == _points(serial)
    assert (parallel.chosen, parallel.front, parallel.efficiency_front) == (serial.chosen, serial.front,
                                                                            serial.efficiency_front)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray is not installed (pip install 'kvcalc[ray]'; the test extra installs it)")
def test_ray_gives_the_serial_plan(cases, serial):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        seen = []
        on_ray = run_plan(_small(cases), ray_address="auto", progress=seen.append)
        assert ray.is_initialized()  # a runtime the caller started is left running
        # a task's own error comes back as it is (not wrapped in Ray's traceback), its parameters kept
        bad = replace(cases.HAND_BASE, burstiness=0.5)
        with pytest.raises(ParameterError) as caught:
            run_points(bad, [(0, cases.HAND_SPACE.points()[0])], lambda index, result: None, ray_address="auto")
        assert caught.value.params == ("burstiness", "arrival") and "Traceback" not in str(caught.value)
    finally:
        ray.shutdown()
    assert _points(on_ray) == _points(serial)
    assert on_ray.chosen == serial.chosen
    assert sum(seen) == len(serial.points)


def test_cache_returns_the_plan_exactly_and_resumes_after_an_interruption(cases, serial, tmp_path):
    class Interrupt(Exception):
        pass

    done = []

    def stop_after_three(units):
        done.append(units)
        if sum(done) == 3:
            raise Interrupt

    cache = PointCache(tmp_path)
    with pytest.raises(Interrupt):
        run_plan(_small(cases), cache=cache, progress=stop_after_three)
    assert len(list(tmp_path.rglob("*.json"))) == 3  # each finished point was written as it finished
    resumed = run_plan(_small(cases), cache=cache)
    assert resumed.cached == 3
    again = run_plan(_small(cases), cache=cache)
    assert again.cached == len(serial.points)
    assert _points(resumed) == _points(again) == _points(serial)


def test_cache_key_changes_with_everything_that_decides_a_point(cases):
    point = cases.HAND_SPACE.points()[0]
    options = point_options(cases.HAND_BASE, point)
    key = point_key("1", "model", "workload", options)
    assert point_key("1", "model", "workload", options) == key
    assert point_key("2", "model", "workload", options) != key
    assert point_key("1", "other", "workload", options) != key
    assert point_key("1", "model", "other", options) != key
    for change in ({"tp": 2}, {"block_size": 32}, {"max_batched_tokens": 4096}, {"dtype": "fp8"}, {"seed": 1},
                   {"slo": "tpot=5ms"}, {"target_attainment": 0.95}, {"rate": "0.1"}, {"gpu": "H100-SXM"}):
        assert point_key("1", "model", "workload", replace(options, **change)) != key, change


def test_a_damaged_cache_file_is_recomputed(cases, tmp_path):
    request = replace(cases.HAND_REQUEST, space=Space(gpus=("H100-SXM",), tp=(1,), replicas=(1,)))
    first = run_plan(request, cache=PointCache(tmp_path))
    (path,) = tmp_path.rglob("*.json")
    path.write_text(path.read_text()[:40])  # truncated, as by a crash mid-write without the rename
    again = run_plan(request, cache=PointCache(tmp_path))
    assert again.cached == 0 and _points(again) == _points(first)
    doc = json.loads(path.read_text())
    doc["key"] = "0" * 64  # another point's file under this name
    path.write_text(json.dumps(doc))
    assert run_plan(request, cache=PointCache(tmp_path)).cached == 0


def test_an_error_in_a_worker_process_reaches_the_caller_whole(cases):
    bad = replace(cases.HAND_BASE, burstiness=0.5)  # burstiness without gamma arrivals: refused by build
    tasks = list(enumerate(cases.HAND_SPACE.points()[:2]))
    with pytest.raises(ParameterError) as caught:
        run_points(bad, tasks, lambda index, result: None, jobs=2)
    assert caught.value.params == ("burstiness", "arrival")
    with pytest.raises(ParameterError, match=r"burstiness 0\.5 applies to arrival gamma"):
        run_plan(replace(cases.HAND_REQUEST, base=bad), jobs=2)  # refused in this process, before any worker


def test_code_fingerprint_follows_the_sources(tmp_path):
    from kvcalc.core.plan.cache import code_fingerprint

    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "steptime.py").write_text("OVERHEAD = 0.5\n")
    first = code_fingerprint(tmp_path)
    assert code_fingerprint(tmp_path) == first
    (tmp_path / "sim" / "steptime.py").write_text("OVERHEAD = 0.4\n")
    assert code_fingerprint(tmp_path) != first
    assert code_fingerprint() == code_fingerprint()  # kvcalc's own core
