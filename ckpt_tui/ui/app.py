"""ckpt-tui's terminal UI: browse, understand and fix a checkpoint from the keyboard.

The App holds only what is global: its configuration, the theme, help, quit and crash reporting. The
checkpoint's state and its jobs live on the MainScreen (screens/main.py)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Iterable, Optional

from textual.app import App, SystemCommand
from textual.clock import Clock
from textual.screen import Screen

from ..core.report import Report
from ..core.storage import as_path
from ..core.types import Node
from .actions import ACTIONS, Action, bindings
from .format import visible
from .screens.dialogs import ConfirmDialog, HelpScreen
from .screens.main import MainScreen


class CkptApp(App[None]):
    # absolute: subclasses elsewhere keep it. Textual loads a pushed screen's CSS_PATH but not the default
    # screen's, so the App names the main screen's file (beside it) too
    CSS_PATH = [Path(__file__).with_name("app.tcss"), MainScreen.CSS_PATH]
    TITLE = "ckpt-tui"
    BINDINGS = bindings(app=True)

    def __init__(self, path: str | Path, *, clock: Optional[Clock] = None, trust_pickles: bool = False) -> None:
        super().__init__()
        self.path = as_path(path)  # a local Path, or a RemotePath for an s3:// (fsspec) URL
        self.clock = clock
        self.trust_pickles = trust_pickles
        self.crash: Optional[BaseException] = None  # the first unhandled exception (see ui/run.py)
        self.show_tracebacks = False  # --debug: Textual prints its own traceback at exit
        self.main = MainScreen(self.path, clock=clock, trust_pickles=trust_pickles)

    def get_default_screen(self) -> MainScreen:
        return self.main  # the default screen: App.query_one finds its widgets, as scripts and tests expect

    # read-only views of the main screen's state, for scripts and tests
    @property
    def report(self) -> Optional[Report]:
        return self.main.report

    @property
    def selected(self) -> Optional[Node]:
        return self.main.selected

    # ------------------------------------------------------------------ global actions
    def action_help(self) -> None:
        self.push_screen(HelpScreen({a.id: a.why_not(self.main) for a in ACTIONS}))

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def action_quit_app(self) -> None:
        running = self.main.running_jobs()
        if not running:
            self.exit()
            return

        def answer(yes: bool | None) -> None:
            if yes:
                for w in self.main.running_jobs():
                    w.cancelled_event.set()
                self.exit()

        self.push_screen(
            ConfirmDialog(
                "A job is running. Quit anyway?",
                "Running jobs are cancelled and their temp output removed.",
                yes="Quit",
                no="Stay",
            ),
            answer,
        )

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for a in ACTIONS:
            yield SystemCommand(a.label, a.help, partial(self._palette, a))

    async def _palette(self, a: Action) -> None:
        """The palette's entry for ``a`` (the palette awaits it: ``run_action`` is a coroutine)."""
        if a.app:
            await self.run_action(a.action)
            return
        why = a.why_not(self.main)
        if why:
            self.notify(visible(f"{a.label}: not now — {why}."), severity="warning", markup=False)
        else:
            await self.run_action(a.action, self.main)

    # ------------------------------------------------------------------ crashes (ui/run.py reports them)
    def _handle_exception(self, error: Exception) -> None:
        if self.crash is None:
            self.crash = error
        super()._handle_exception(error)

    def _print_error_renderables(self) -> None:
        """Textual prints a full traceback after restoring the terminal; we print one line and a log
        file instead (ui/run.py), unless --debug asked for the traceback."""
        if self.show_tracebacks:
            super()._print_error_renderables()
        else:
            self._exit_renderables.clear()


def make_app(path: str | Path, **kw: Any) -> CkptApp:
    """The one factory used by the entry point, the tests and the screenshot script."""
    return CkptApp(path, **kw)
