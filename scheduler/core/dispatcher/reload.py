"""Settings reload (SIGHUP, ``systemctl reload``): requested by a signal, applied by the loop between passes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from scheduler.base.errors import SchedulerError
from scheduler.core.contracts import LoadedExecutors
from scheduler.core.dispatcher.config import clock
from scheduler.settings.load import Settings, replace_settings

log = logging.getLogger("scheduler.core.dispatcher")


class SettingsReload:
    """A pending reload (``requested``) and how it is applied (``apply``)."""

    def __init__(self, executors: LoadedExecutors, say: Callable[[str], None],
                 check: Callable[[Settings], None] | None = None) -> None:
        self.executors = executors
        self.say = say
        #: Judges the new settings before they are installed (``Parts.settings_check``).
        self.check = check
        #: Set by the signal handler; the loop applies the reload on its next pass.
        self.requested = threading.Event()

    def apply(self) -> None:
        """Re-read and validate the settings; invalid ones are logged and the previous settings kept.

        On success executors are loaded afresh for the next runs (plugin settings are given
        at load); running runs keep the executor they started with. ``[dispatcher]``
        concurrency, lease TTL and grace are fixed for the process (flags win): restart for those.
        """
        self.requested.clear()
        try:
            fresh = replace_settings(self.check)
        except SchedulerError as exc:
            log.error("settings reload failed, keeping the previous settings: %s", exc.message)
            self.say(f"{clock()} settings reload failed ({exc.code}), keeping the previous settings: {exc.message}")
            return
        self.executors.forget()
        self.say(f"{clock()} settings reloaded from {fresh.file.source}")
