"""A job's progress reports reach the UI paced (ui/jobs.py): a flood of reports from the job's thread posts one
message; the UI reads the latest, and again PROGRESS_EVERY later while reports keep coming; when none came, the next
report posts anew. No report is lost at the end, and the UI is woken at most 10 times a second."""

from __future__ import annotations

import threading
import time

from ckpt_tui.core.progress import Progress
from ckpt_tui.ui.jobs import JobProgress, _Latest


def test_a_flood_posts_one_message_and_the_reads_give_the_latest_until_it_stops():
    latest = _Latest()
    posts = [i for i in range(10_000) if latest.put(Progress(i, 10_000, "files"))]
    assert posts == [0]  # one message carries them all
    msg = JobProgress(None, Progress(0, 10_000, "files"), latest)  # type: ignore[arg-type]
    assert msg.progress == Progress(9_999, 10_000, "files")
    assert msg.progress is msg.progress  # read once: the same report however often the handler looks
    assert not latest.put(Progress(10_000, 20_000, "files"))  # read, but the next read is due: kept, not posted
    assert msg.again() == Progress(10_000, 20_000, "files")  # the paced read gives it
    assert msg.again() is None  # nothing came since: the next report posts a message
    assert latest.put(Progress(10_001, 20_000, "files"))


def test_reports_from_a_thread_while_the_ui_reads_lose_none_at_the_end():
    latest = _Latest()
    posted: list[JobProgress] = []
    done = threading.Event()

    def job() -> None:
        for i in range(20_000):
            if latest.put(Progress(i, 20_000, "files")):
                posted.append(JobProgress(None, Progress(i, 20_000, "files"), latest))  # type: ignore[arg-type]
            if i % 1000 == 0:
                time.sleep(0.001)  # pauses: the reader finds nothing new at times, and a report posts anew
        done.set()

    t = threading.Thread(target=job)
    t.start()
    seen: list[int] = []
    read = 0
    while True:  # the UI: each posted message read, then read again until it gives nothing
        finished = done.is_set()
        if read < len(posted):
            msg = posted[read]
            read += 1
            seen.append(msg.progress.done)
            while (p := msg.again()) is not None:
                seen.append(p.done)
        elif finished:
            break
    t.join()
    assert seen[-1] == 19_999  # the last report is read, whatever was coalesced on the way
    assert seen == sorted(seen)
    assert len(posted) < 20_000  # coalesced


async def test_the_ui_reads_a_flood_of_reports_at_most_ten_times_a_second(tmp_path):
    """A job reporting 200,000 times in a row: the screen shows its progress a bounded number of times (the paced
    reads), the last report among them."""
    import torch
    from safetensors.torch import save_file

    from ckpt_tui.ui.app import make_app
    from ckpt_tui.ui.job_kinds import EXPORT
    from ckpt_tui.ui.jobs import JobInfo
    from ckpt_tui.ui.screens.main import MainScreen
    from tests.functional.ui.test_app import wait_for

    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    app = make_app(tmp_path)
    shown: list[int] = []
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        screen = app.main
        real = MainScreen._show_progress

        def spy(self, worker, progress):
            shown.append(progress.done)
            real(self, worker, progress)

        screen._show_progress = spy.__get__(screen)  # type: ignore[method-assign]
        gate = threading.Event()
        t0 = time.monotonic()

        def fn(on_progress, cancel):
            for i in range(200_000):
                on_progress(Progress(i + 1, 200_000, "steps"))
            gate.wait(30)

        worker = EXPORT.start(screen, JobInfo(EXPORT.name, "flood"), fn)
        await wait_for(pilot, lambda: shown and shown[-1] == 200_000, timeout=30)
        took = time.monotonic() - t0
        gate.set()
        await wait_for(pilot, lambda: worker.is_finished)
    assert len(shown) <= 2 + 10 * took * 1.5  # at most ~10 a second (timers may fire a little late, never early)
    assert shown == sorted(shown)
