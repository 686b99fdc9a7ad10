"""Other projects' names for tether's settings, as one table: TRL's (and Hugging Face TrainingArguments') and
LLaMA-Factory's keys, each mapped to the tether setting with the same meaning, with its values translated, derived
with others (the batch sizes), accepted as having no effect here, or refused with what to write instead.

The same table serves a flat YAML file (``learning_rate: 1e-5``), the Python API's keywords
(``tether.grpo(..., learning_rate=1e-5)``) and command-line flags (``--learning_rate 1e-5``): tether/config.py
calls ``translate`` for every key that is not a tether flag name. A name that means something else in tether is
explained, never "did you mean"-ed to the wrong option; every unknown key of a file is reported at once. The
migration tables in docs/python-api.md and docs/data.md are generated from it (``python -m tether.compat``), so the
docs cannot drift from the code.

Where a project's meaning depends on the number of processes (TRL's per-device batch sizes), ``WORLD_SIZE`` (set by
accelerate launch and torchrun) is read when the config is built, in each process alike.

The package: ``table`` (the entries), ``lookup`` (a key's entry for a stage, numeric readings), ``derive`` (the
settings computed from several keys), ``args`` (TRL's trainer arguments and config objects), ``translate`` (reading
flat keys through all of it), ``docs`` (the generated migration tables, written by ``__main__``).

May import: ``tether.errors`` and ``tether.console``, nothing else of tether's (config.py calls it).
"""

from tether.compat.args import API_INPUTS, TheirDefault, api_input, args_settings, peft_settings
from tether.compat.docs import DOCS, MARK, docs_with_tables, migration_table, replace_between
from tether.compat.lookup import knows
from tether.compat.table import ONLINE
from tether.compat.translate import problem_report, translate, translate_key

__all__ = [
    "API_INPUTS",
    "DOCS",
    "MARK",
    "ONLINE",
    "TheirDefault",
    "api_input",
    "args_settings",
    "docs_with_tables",
    "knows",
    "migration_table",
    "peft_settings",
    "problem_report",
    "replace_between",
    "translate",
    "translate_key",
]
