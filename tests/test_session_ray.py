"""Each test starts on the session's Ray as on a fresh one (conftest's `session_ray_as_new`): here, what it does
when a test left CPUs held that are not released in time."""

from __future__ import annotations

import pytest
from conftest import _release_held_cpus


def test_cpus_held_past_the_deadline_fail_the_next_test_naming_the_actor(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=1)
    class CpuHolder:
        def ready(self) -> bool:
            return True

    holder = CpuHolder.remote()
    ray.get(holder.ready.remote())
    try:
        with pytest.raises(
            pytest.fail.Exception, match=r"has 1\.0 of 2\.0 CPUs free 2 s after .*alive actors: \[.*CpuHolder'"
        ):
            _release_held_cpus(deadline_s=2)
    finally:
        ray.kill(holder)
    _release_held_cpus(deadline_s=60)  # released once the actor is gone: the wait ends without failing
