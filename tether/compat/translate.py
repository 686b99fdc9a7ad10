"""Reading flat keys (a YAML file, the Python API's keywords, foreign command-line flags) through the table: each key
to tether's dotted setting, the derivations after, every problem reported at once, the notes said once."""

from __future__ import annotations

import os

from tether.compat.args import TheirDefault, warmup_setting
from tether.compat.derive import derive
from tether.compat.lookup import _also, _entry, _target, knows, problem_report
from tether.compat.table import INDEX, LF_STAGES
from tether.errors import ConfigError


def translate(
    stage: str,
    values: dict,
    flags: dict[str, str],
    source: str,
    problems: list[str] | None = None,
    written: dict[str, str] | None = None,
    say: bool = True,
) -> dict[str, object]:
    """{dotted tether key: value} for a stage from flat keys written in tether's flag names or another project's
    (NAMES). ``flags``: the stage's {flag: dotted key}. Every key that cannot be read is reported at once: raised,
    or added to ``problems`` when given (the caller adds its own and raises). ``written``, when given, gets
    {dotted key: the key as the file wrote it}, so that a later error about the value names the file's key.
    A ``TheirDefault`` value (args=) is read the same way, before the keys the user wrote (which win); one tether
    cannot read leaves tether's own setting, named in a note."""
    out: dict[str, object] = {}
    written = {} if written is None else written
    collect = problems is not None
    problems = problems if collect else []
    implied = {k for k, v in values.items() if isinstance(v, TheirDefault)}
    values = {k: v.value if isinstance(v, TheirDefault) else v for k, v in values.items()}
    ignored, notes, unheld = [], [], []
    theirs = values.get("stage")
    if theirs is not None and LF_STAGES.get(str(theirs)) != stage:  # the one problem worth naming: the command
        command = f"tether {LF_STAGES[str(theirs)]}" if str(theirs) in LF_STAGES else "no tether stage"
        raise ConfigError(f"{source}: stage: {theirs}: this config is for {command}, not tether {stage}")
    for key in sorted(values, key=lambda k: k not in implied):  # their defaults first: the user's keys win
        settings, problem, no_effect = translate_key(stage, key, values[key], values, flags)
        if problem and key in implied:
            unheld.append(f"{key}={values[key]!r}")
        elif problem:
            problems.append(problem)
        elif no_effect and key not in implied:
            ignored.append(no_effect)
        for dotted, value in settings.items():
            out[dotted], written[dotted] = value, key
    if problems:
        if collect:
            return out
        raise ConfigError(problem_report(source, problems))
    try:
        out.update(derive(stage, values, flags, notes, implied))
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None  # name the file (or the call) the keys came from
    if ignored:
        notes.append("no effect in tether: " + "; ".join(ignored))
    if unheld:
        notes.append(
            "their config's defaults with no tether equivalent, tether's own setting kept: " + ", ".join(unheld)
        )
    if say:
        _say(source, notes)
    return out


def translate_key(stage: str, key: str, value, values: dict, flags: dict) -> tuple[dict, str, str]:
    """One flat key: ({dotted: value} it sets, the problem if it cannot be read, the no-effect note if accepted)."""
    own = flags.get("--" + str(key).replace("_", "-"))
    partner = {"reward_weights": "reward_funcs", "loss_weights": "loss_type"}.get(key)  # TRL's lists of weights
    trl_weights = partner is not None and (isinstance(value, (list, tuple)) or partner in values)
    if value is None and (own is not None or knows(key)):
        return {}, "", ""  # TRL and LLaMA-Factory write null for "not set" (a config dump holds many)
    if key == "warmup_steps" and warmup_setting(value)[0] == "warmup_ratio":
        return {flags["--warmup-ratio"]: value}, "", ""  # transformers 5's fraction of the run
    if own is not None and not trl_weights:
        return {own: value}, "", ""
    entry = _entry(stage, key, flags)
    if entry is None:
        return {}, _unknown(stage, key, flags), ""
    if entry.kind == "ignored":
        return {}, "", f"{key} ({entry.note})"
    if entry.kind == "refused":
        return {}, f"{key}: {entry.note}", ""
    if entry.kind not in ("same", "values"):
        return {}, "", ""  # derived: read with the others by _derive
    target = _target(entry, stage)
    if entry.kind == "values":
        lookup = value.lower() if isinstance(value, str) and value.lower() in ("true", "false") else value
        lookup = {"true": True, "false": False}.get(lookup, lookup) if isinstance(lookup, str) else lookup
        try:
            known = lookup in entry.values
        except TypeError:  # a list or a mapping where a value is expected
            known = False
        if not known:
            accepted = ", ".join(str(k) for k in entry.values)
            return {}, f"{key}: {value!r} has no tether equivalent (accepted: {accepted})" + _also(entry.note), ""
        value = entry.values[lookup]
        if value is None:
            return {}, "", ""  # a value that is tether's behaviour already
    if not target or target not in flags:
        return (
            {},
            f"{key}: no {target or 'equivalent'} in tether {stage}" + (f" ({entry.note})" if entry.note else ""),
            "",
        )
    if key == "lora_target" or key == "lora_target_modules":
        value = ["all-linear" if v == "all" else v for v in (value.split(",") if isinstance(value, str) else value)]
    if key == "pref_beta" and values.get("pref_loss") == "orpo":  # LLaMA-Factory's ORPO: sft + pref_beta · odds ratio
        target = "--orpo-lambda"
    out = {flags[target]: value}
    if key in ("epsilon", "cliprange") and values.get("epsilon_high") is None:  # TRL: None is epsilon
        out[flags["--clip-high"]] = value
    return out, "", ""


def _unknown(stage: str, key: str, flags: dict) -> str:
    """An unknown key's line: another stage's key, or a close tether flag name (never a foreign false friend)."""
    import difflib

    if key in INDEX:
        where = sorted({s for e in INDEX[key] for s in (e.stages or (e.to if isinstance(e.to, dict) else ()))})
        return f"{key}: not a setting of tether {stage}" + (f" (it applies to {', '.join(where)})" if where else "")
    names = sorted(
        {f[2:].replace("-", "_") for f in flags}
        | {k for k in INDEX if (e := _entry(stage, k, flags)) and e.kind in ("same", "values")}
    )
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.7)
    return f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


_SAID: set[str] = set()


def _say(source: str, notes: list[str]) -> None:
    """Each translation note once per process, from process 0 only."""
    if os.environ.get("RANK", "0") != "0":
        return
    from tether.console import console

    for note in notes:
        if note not in _SAID:
            _SAID.add(note)
            console.print(f"{source}: {note}")
