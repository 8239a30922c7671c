"""A job's progress reports reach the UI as at most one waiting message (ui/jobs.py): a flood of reports from the
job's thread wakes the UI once per read, not once per report, and the read gives the latest report."""

from __future__ import annotations

import threading

from ckpt_tui.core.progress import Progress
from ckpt_tui.ui.jobs import JobProgress, _Latest


def test_a_flood_posts_one_message_until_it_is_read_and_the_read_gives_the_latest():
    latest = _Latest()
    posts = [i for i in range(10_000) if latest.put(Progress(i, 10_000, "files"))]
    assert posts == [0]  # one message carries them all
    msg = JobProgress(None, Progress(0, 10_000, "files"), latest)  # type: ignore[arg-type]
    assert msg.progress == Progress(9_999, 10_000, "files")
    assert msg.progress is msg.progress  # read once: the same report however often the handler looks
    assert latest.put(Progress(10_000, 10_000, "files"))  # read: the next report posts again


def test_reports_from_a_thread_while_the_ui_reads_lose_none_at_the_end():
    latest = _Latest()
    posted: list[JobProgress] = []
    done = threading.Event()

    def job() -> None:
        for i in range(20_000):
            if latest.put(Progress(i, 20_000, "files")):
                posted.append(JobProgress(None, Progress(i, 20_000, "files"), latest))  # type: ignore[arg-type]
        done.set()

    t = threading.Thread(target=job)
    t.start()
    seen: list[int] = []
    while not done.is_set() or len(seen) < len(posted):
        if len(seen) < len(posted):
            seen.append(posted[len(seen)].progress.done)
    t.join()
    assert seen[-1] == 19_999  # the last report is read, whatever was coalesced on the way
    assert seen == sorted(seen)
