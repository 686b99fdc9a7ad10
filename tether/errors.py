"""The two errors a user is meant to read: a wrong setting and bad input data. Each message names what is wrong
(the option, or the file, line and field) and how to fix it; the command line prints them without a traceback."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is wrong; the message says which and how to fix it."""


class DataError(ValueError):
    """Bad input data; the message names the file, the line or row, and the field."""
