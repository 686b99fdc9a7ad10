"""A judge's prompt as a file the user can replace: YAML front matter saying how the judge is asked and read, then the
body with {{variables}} (docs/reward-models.md, "Judge templates").

    ---
    mode: pairwise          # pointwise | pairwise | group
    read: probs             # probs: the verdict tokens' probabilities, no generation; text: greedy, then `pattern`
    verdicts: ["A", "B"]    # pairwise: [the first shown wins, the second wins]; pointwise: {"1": 1, ...}
    answer_prefix: "Better:\\n"  # what the judge's answer starts with; the verdict is read right after it
    chat: auto              # the body as one user turn under the judge's chat template (auto: if it has one)
    ---
    Request: {{prompt}}
    ...

Everything is checked when the run starts, before any weight loads: the front matter's keys and values, the body's
variables (the mode's required ones present, no unknown name, each error naming the file and line), and each
verdict being exactly one token of the judge's tokenizer right after the prefix in context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from tether.algorithms.choices import JUDGE_MODES, JUDGE_READS
from tether.config import ConfigError
from tether.data.records import read_records

SHIPPED = Path(__file__).with_name("judge_templates")
VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")
REQUIRED = {
    "pointwise": ("prompt", "response"),
    "pairwise": ("prompt", "response_a", "response_b"),
    "group": ("prompt", "responses"),
}
OPTIONAL = {"pointwise": (), "pairwise": (), "group": ("k",)}
KEYS = ("mode", "read", "verdicts", "answer_prefix", "chat", "pattern", "item")
ITEM_VARIABLES = ("index", "response")


SAVED = "judge_template.txt"  # the template a `tether judge` folder was trained with, saved beside its weights


def template_path(name: str, judge_dir: str | Path = "") -> Path:
    """A shipped template by name (pointwise, pairwise, group) or a file; empty: the judge folder's saved template,
    else the shipped pointwise one."""
    if not name:
        saved = Path(judge_dir) / SAVED if judge_dir else None
        return saved if saved is not None and saved.is_file() else SHIPPED / "pointwise.txt"
    if name in JUDGE_MODES:
        return SHIPPED / f"{name}.txt"
    path = Path(name)
    if not path.is_file():
        raise ConfigError(
            f"judge.template={name!r}: neither a shipped template ({', '.join(JUDGE_MODES)}) nor a readable file"
        )
    return path


def prompt_text(prompt) -> str:
    """A prompt row's 'prompt' as the judge sees it: a string as is; chat messages as their contents, one blank line
    apart (the judge reads the request, not the policy's chat template)."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(str(m.get("content", "")) for m in prompt)


@dataclass(frozen=True)
class JudgeTemplate:
    path: Path
    mode: str
    read: str
    verdicts: tuple[str, ...]  # pointwise: the score tokens; pairwise: (first wins, second wins); group: ()
    values: tuple[float, ...]  # pointwise: the score each verdict stands for
    answer_prefix: str
    chat: str  # auto | true | false
    pattern: str
    item: str
    body: str
    body_line: int  # the file's line number of the body's first line
    columns: tuple[str, ...]  # the {{column.NAME}} the body reads

    @classmethod
    def load(cls, name: str, judge_dir: str | Path = "") -> "JudgeTemplate":
        path = template_path(name, judge_dir)
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        if not lines or lines[0].strip() != "---" or "---" not in [x.strip() for x in lines[1:]]:
            raise ConfigError(f"{path}: a judge template starts with front matter between two '---' lines")
        end = 1 + [x.strip() for x in lines[1:]].index("---")
        try:
            head = yaml.safe_load("\n".join(lines[1:end])) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: the front matter is not YAML ({str(err)[:200]})") from None
        if not isinstance(head, dict):
            raise ConfigError(f"{path}: the front matter must be key: value lines")
        unknown = sorted(set(head) - set(KEYS))
        if unknown:
            raise ConfigError(f"{path}: unknown front-matter key(s) {unknown}; the keys are {', '.join(KEYS)}")
        mode, read = head.get("mode"), head.get("read", "probs")
        if mode not in JUDGE_MODES:
            raise ConfigError(f"{path}: mode={mode!r}: choose {', '.join(JUDGE_MODES)}")
        if read not in JUDGE_READS:
            raise ConfigError(f"{path}: read={read!r}: choose {', '.join(JUDGE_READS)}")
        verdicts, values = _verdicts(path, mode, head.get("verdicts"))
        chat = str(head.get("chat", "auto")).lower()
        if chat not in ("auto", "true", "false"):
            raise ConfigError(f"{path}: chat={head.get('chat')!r}: choose auto, true or false")
        prefix, pattern, item = head.get("answer_prefix", ""), head.get("pattern", ""), head.get("item", "")
        if not isinstance(prefix, str) or not isinstance(pattern, str) or not isinstance(item, str):
            raise ConfigError(f"{path}: answer_prefix, pattern and item are strings")
        template = cls(
            path, mode, read, verdicts, values, prefix, chat, pattern, item, "\n".join(lines[end + 1 :]), end + 2, ()
        )
        return template._checked()

    def _checked(self) -> "JudgeTemplate":
        used = {}
        for n, line in enumerate(self.body.split("\n")):
            for match in VARIABLE.finditer(line):
                used.setdefault(match.group(1), self.body_line + n)
        known = set(REQUIRED[self.mode]) | set(OPTIONAL[self.mode])
        for name, line in used.items():
            if name not in known and not name.startswith("column."):
                raise ConfigError(
                    f"{self.path}:{line}: unknown variable {{{{{name}}}}}; a {self.mode} template knows "
                    + ", ".join(f"{{{{{k}}}}}" for k in sorted(known))
                    + " and {{column.NAME}} (a prompt-file column)"
                )
        for name in REQUIRED[self.mode]:
            if name not in used:
                raise ConfigError(f"{self.path}: the body never uses {{{{{name}}}}}, which a {self.mode} judge needs")
        if self.read == "text":
            if not self.pattern:
                raise ConfigError(f"{self.path}: read=text needs a pattern whose group 1 is the verdict")
            try:
                groups = re.compile(self.pattern).groups
            except re.error as err:
                raise ConfigError(
                    f"{self.path}: pattern={self.pattern!r} is not a regular expression ({err})"
                ) from None
            if groups < 1:
                raise ConfigError(f"{self.path}: pattern={self.pattern!r} has no group: group 1 is the verdict")
            if self.mode == "group":
                raise ConfigError(f"{self.path}: a group judge is read from its label probabilities (read: probs)")
        if self.mode == "group":
            item_names = {m.group(1) for m in VARIABLE.finditer(self.item)}
            if "response" not in item_names or item_names - set(ITEM_VARIABLES):
                raise ConfigError(
                    f"{self.path}: item={self.item!r}: a group template lists each answer with an item using "
                    "{{index}} and {{response}} (no other variable)"
                )
        columns = tuple(sorted(n[len("column.") :] for n in used if n.startswith("column.")))
        return JudgeTemplate(**{**self.__dict__, "columns": columns})

    def fill(self, values: dict[str, str], row: dict) -> str:
        """The body with its variables replaced in one pass (an answer that contains '{{prompt}}' stays as written)."""

        def value(match: re.Match) -> str:
            name = match.group(1)
            if name.startswith("column."):
                return str(row.get(name[len("column.") :], ""))
            return values[name]

        return VARIABLE.sub(value, self.body)

    def listing(self, responses: list[str]) -> str:
        """A group's answers, one item each, labelled 1..G."""
        return "\n".join(
            VARIABLE.sub(lambda m, i=i, r=r: str(i + 1) if m.group(1) == "index" else r, self.item)
            for i, r in enumerate(responses)
        )


def _verdicts(path: Path, mode: str, given) -> tuple[tuple[str, ...], tuple[float, ...]]:
    if mode == "group":
        if given is not None:
            raise ConfigError(f"{path}: a group judge's verdicts are the labels 1..G of its listing; drop 'verdicts'")
        return (), ()
    if mode == "pairwise":
        if not isinstance(given, list) or len(given) != 2 or not all(isinstance(v, str) and v for v in given):
            raise ConfigError(f"{path}: a pairwise judge's verdicts are two strings: [first shown wins, second wins]")
        if given[0] == given[1]:
            raise ConfigError(f"{path}: the two verdicts are the same string {given[0]!r}")
        return tuple(given), ()
    if isinstance(given, list):
        given = {str(v): v for v in given}
    if not isinstance(given, dict) or len(given) < 2:
        raise ConfigError(f"{path}: a pointwise judge's verdicts map each score token to its value, e.g. {{'1': 1}}")
    try:
        values = tuple(float(v) for v in given.values())
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: verdicts={given!r}: every score token needs a number") from None
    return tuple(str(k) for k in given), values


def check_judge_config(judge, stage: str, group_size: int, env: str = "", other_reward: bool = False) -> None:
    """The judge section against its stage, read from the template's front matter (no tokenizer, no weights):
    which modes and baselines a stage can use."""
    if not judge.model:
        return
    if env:
        raise ConfigError(
            f"--judge-model with --env {env}: the environment scores the episodes; call a judge inside its "
            "outcome() (docs/agents.md)"
        )
    t = JudgeTemplate.load(judge.template, judge.model)
    where = f"--judge-model with the {t.mode} template {t.path}"
    if t.mode == "group" and stage != "grpo":
        raise ConfigError(f"{where}: a group judge ranks a group's answers; it serves tether grpo (groups of 2-9)")
    if t.mode == "group" and not 2 <= group_size <= 9:
        raise ConfigError(f"{where}: rollout.group_size={group_size}; the labels 1..G are one token each up to 9")
    if t.mode != "pairwise" and judge.baseline:
        raise ConfigError(f"{where}: judge.baseline={judge.baseline!r} is for pairwise judges; leave it empty")
    if t.mode == "pairwise":
        allowed = {"dpo": ("",), "ppo": ("column:",), "grpo": ("column:", "group")}[stage]
        if not any(judge.baseline.startswith(a) if a else not judge.baseline for a in allowed):
            needs = {
                "dpo": "empty: online DPO's judge compares the pair itself",
                "ppo": "column:NAME: PPO scores one answer a prompt, against a column (a reference answer)",
                "grpo": "column:NAME (a reference answer in the prompt file) or group (round robin in the group)",
            }[stage]
            raise ConfigError(f"{where}: judge.baseline={judge.baseline!r}; it must be {needs}")
    if t.mode == "pairwise" and stage == "dpo" and other_reward:
        raise ConfigError(
            f"{where}: online DPO's pairwise judge labels each pair itself; a reward beside it would be ignored. "
            "Drop --reward/--reward-model, or use a pointwise judge (its score is added to the reward)"
        )
    if t.read == "text" and judge.min_verdict_mass:
        raise ConfigError(f"{where}: judge.min_verdict_mass is for a probability read; this template reads text")


def check_judge_rows(judge, rows: list[dict], path: str, columns=None) -> None:
    """Every prompt row has the columns the judge reads ({{column.NAME}} in its template, column:NAME baseline).
    ``rows`` are data/prompts.py prompt_rows(path, columns): one a record, in order."""
    t = JudgeTemplate.load(judge.template, judge.model)
    names = list(t.columns) + ([judge.baseline[len("column:") :]] if judge.baseline.startswith("column:") else [])
    for name in names:
        missing = next((i for i, row in enumerate(rows) if not isinstance(row.get(name), str)), None)
        if missing is not None:
            # the rows keep no line numbers (blank lines are skipped): the file is read again to name the record's
            where = read_records(path, columns)[missing].where
            raise ConfigError(
                f"{where}: no text column {name!r}, which the judge reads (template {t.path}, "
                f"judge.baseline={judge.baseline!r})"
            )
