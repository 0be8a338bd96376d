"""A reporter for tests: keeps what featpipe says, as (level, line)."""

from __future__ import annotations

from featpipe.reporting import Reporter


class KeptLines(Reporter):
    """Keeps what is said: ("info" | "warn", text), in order."""

    def __init__(self):
        self.lines = []

    def info(self, text):
        self.lines.append(("info", text))

    def warn(self, text):
        self.lines.append(("warn", text))
