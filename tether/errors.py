"""The errors a user is meant to read: a wrong setting, bad input data, and a process tether started beside the
trainer that died, failed or went silent. Each message names what is wrong (the option; the file, line and field;
the process and how it ended) and how to fix it; the command line prints them without a traceback of its own."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is wrong; the message says which and how to fix it."""


class DataError(ValueError):
    """Bad input data; the message names the file, the line or row, and the field."""


class WorkerError(RuntimeError):
    """A process beside the trainer (the rollout worker) died, failed or answered nothing in time; the message names
    it, its exit code or its own traceback. The run stops: nothing falls back to sampling elsewhere."""
