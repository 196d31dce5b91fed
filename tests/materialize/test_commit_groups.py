"""A copy's commit takes the groups finished after its own, in order, up to the first still running,
at most ``GROUPS_PER_COMMIT`` in all (``file_copy.finished_after``)."""

from __future__ import annotations

from concurrent.futures import Future

from headrace.engines.chunks import ChunkFile
from headrace.materialize.file_copy import GROUPS_PER_COMMIT, finished_after


def _future(result: list[ChunkFile] | None | Exception = None, done: bool = True) -> Future[list[ChunkFile] | None]:
    future: Future[list[ChunkFile] | None] = Future()
    if not done:
        return future
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
    return future


def test_the_finished_groups_after_a_commits_own_join_it_up_to_the_first_unfinished() -> None:
    files = [ChunkFile(0, None)]
    futures = [_future(files), _future(files), _future(files), _future(done=False), _future(files)]
    assert [g for g, _ in finished_after(futures, 0)] == [1, 2]
    assert [g for g, _ in finished_after(futures, 3)] == [4]
    assert finished_after(futures, 4) == []


def test_a_stopped_or_failed_group_and_the_cap_end_what_a_commit_takes() -> None:
    files = [ChunkFile(0, None)]
    assert [g for g, _ in finished_after([_future(files), _future(files), _future(None), _future(files)], 0)] == [1]
    assert finished_after([_future(files), _future(RuntimeError("read failed")), _future(files)], 0) == []
    many = [_future(files) for _ in range(3 * GROUPS_PER_COMMIT)]
    assert len(finished_after(many, 0)) == GROUPS_PER_COMMIT - 1
