import time

from switchyard.ids import id_time, new_id
from switchyard.subjects import cancel


def test_ids_sort_by_creation_time_and_are_unique() -> None:
    ids = [new_id(now=1_700_000_000 + i * 0.001) for i in range(1000)]
    assert ids == sorted(ids)
    assert len(set(new_id() for _ in range(10_000))) == 10_000


def test_id_round_trips_its_time_and_is_a_subject_token() -> None:
    now = time.time()
    rid = new_id(now)
    assert abs(id_time(rid) - now) < 0.002
    assert cancel(rid) == f"cancel.{rid}"
