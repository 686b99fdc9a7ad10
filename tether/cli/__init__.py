"""The command line, `tether <command> [options]` (the `tether` script and `python -m tether` call ``run``):

- ``dispatch``: ``main`` (parse, run the command; a ConfigError or DataError is one line and exit 2, Ctrl-C the last
  step and checkpoint) and ``run`` (main, then exit); a stage's command, ``sft --demo``;
- ``parser``: ``build_parser``: a command per row of the stage table (``tether.config.STAGES``), its flags from its
  config class, then the tools; other projects' flag names; one line per unknown flag;
- ``tools``: the tool commands (lab, eval, bench, diagnose, report, recipes), each declaring its flags once as a
  ``CommandConfig`` of sections (``DecodingSection``: how a tool samples);
- ``data``: `tether data check | agreement | filter | prm-labels`, declared the same way.

A new stage is a row of the stage table, not a change here; a new tool is a ``Command`` row in ``tools.TOOLS`` (or
in ``data.DATA``) with its CommandConfig and its function.

May import: every floor below (the API, the lab, the stages' configs and helpers, and the floors they stand on);
nothing imports it but ``tether.__main__``.
"""

from tether.cli.dispatch import main, run
from tether.cli.parser import build_parser

__all__ = ["build_parser", "main", "run"]
