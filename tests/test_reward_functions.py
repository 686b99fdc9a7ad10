"""Python reward functions: loading, the signature check and dry run, errors handled as documented."""

import sys
import textwrap

import pytest

from tether.config import ConfigError
from tether.rewards import RewardSet, parse_reward_specs
from tether.rewards.functions import RewardComponent, RewardFunctionError

ROWS = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "What is 3+3?", "answer": "6"}]


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(
        textwrap.dedent("""
        def exact(completions, answer):
            return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

        def length(completion_ids, **kwargs):
            assert "answer" in kwargs and "prompts" in kwargs
            return [float(len(ids)) for ids in completion_ids]

        def needs_missing(completions, solution):
            return [0.0] * len(completions)

        def raises(completions):
            if any(completions):
                raise ValueError("boom")
            return [0.0] * len(completions)

        def wrong_count(completions):
            return [1.0]

        def not_a_number(completions):
            return ["yes"] * len(completions)

        def nan(completions):
            return [float("nan")] * len(completions)

        def steps(completions):
            return [[0.5, 1.0] for _ in completions]
    """)
    )
    return path


def rewards(path, *names, **kw):
    return RewardSet(parse_reward_specs([f"{path}:{n}" for n in names]), columns=["prompt", "answer"], **kw)


def test_functions_get_the_columns_they_declare_and_weights_sum(reward_file):
    rs = RewardSet(
        parse_reward_specs([f"{reward_file}:exact=2", f"{reward_file}:length=0.5"]), columns=["prompt", "answer"]
    )
    rs.check(ROWS)
    parts = rs.score(ROWS, ["4", "7"], [[5, 6, 7], [8]], [False, True])
    assert parts == {"exact": [1.0, 0.0], "length": [3.0, 1.0]}
    assert [c.weight for c in rs.components] == [2.0, 0.5]  # the weighted sum: tests/test_scorer.py


def test_missing_column_is_reported_before_training(reward_file):
    with pytest.raises(ConfigError, match=r"needs_missing needs \['solution'\].*columns \['answer', 'prompt'\]"):
        rewards(reward_file, "needs_missing").check(ROWS)


def test_wrong_count_and_non_numbers_fail_the_dry_run(reward_file):
    with pytest.raises(ConfigError, match="wrong_count returned 1 values for 2 completions"):
        rewards(reward_file, "wrong_count").check(ROWS)
    with pytest.raises(ConfigError, match="not_a_number: value 0 is 'yes'"):
        rewards(reward_file, "not_a_number").check(ROWS)
    with pytest.raises(ConfigError, match="not finite"):
        rewards(reward_file, "nan").check(ROWS)


def test_a_number_written_as_text_is_not_a_score():
    textual = RewardSet([RewardComponent("textual", lambda completions: ["0.9", "1e3"])], columns=["prompt"])
    with pytest.raises(RewardFunctionError, match="textual: value 0 is '0.9', not a number"):
        textual.score(ROWS, ["4", "7"], [[5], [8]], [False, False])
    verdicts = RewardSet([RewardComponent("verdicts", lambda completions: [True, False])], columns=["prompt"])
    assert verdicts.score(ROWS, ["4", "7"], [[5], [8]], [False, False]) == {"verdicts": [1.0, 0.0]}


def test_a_raising_function_stops_the_run_or_is_scored_and_counted(reward_file):
    strict = rewards(reward_file, "raises")
    strict.check(ROWS)  # empty completions: fine
    with pytest.raises(RewardFunctionError, match=r"raises raised ValueError: boom .*first prompt: 'What is 2\+2\?'"):
        strict.score(ROWS, ["x", "y"], [[1], [2]], [False, False])
    lenient = rewards(reward_file, "raises", on_error="score", error_score=-1.0)
    assert lenient.score(ROWS, ["x", "y"], [[1], [2]], [False, False]) == {"raises": [-1.0, -1.0]}
    assert lenient.components[0].errors == 1


def test_step_scores_are_kept_but_not_summed_for_ppo(reward_file):
    rs = rewards(reward_file, "steps")
    parts = rs.score(ROWS, ["a", "b"], [[1], [2]], [False, False])
    assert parts["steps"] == [[0.5, 1.0], [0.5, 1.0]]  # refused by PPO's scorer: tests/test_scorer.py


def test_bad_specs_say_what_is_wrong(reward_file, tmp_path):
    with pytest.raises(ConfigError, match="expected module:function"):
        parse_reward_specs(["no_colon"])
    with pytest.raises(ConfigError, match="no file"):
        parse_reward_specs([f"{tmp_path}/absent.py:f"])
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        parse_reward_specs([f"{reward_file}:nope"])
    with pytest.raises(ConfigError, match="cannot import"):
        parse_reward_specs(["surely_not_a_module_xyz:f"])
    with pytest.raises(ConfigError, match="weight after '='"):
        parse_reward_specs([f"{reward_file}:exact=heavy"])


def test_importable_module_spec(reward_file, monkeypatch):
    monkeypatch.syspath_prepend(str(reward_file.parent))
    [component] = parse_reward_specs(["my_rewards:exact=3"])
    assert component.name == "exact" and component.weight == 3.0
    sys.modules.pop("my_rewards", None)


def test_builtin_rewards_by_hand():
    from tether.rewards import builtin as b

    assert b.exact_answer(
        ["3 + 4 = 7. The answer is 7.", "The answer is 8.", "so \\boxed{1,000}", "none"], [7, "7", 1000, "x"]
    ) == [1.0, 0.0, 1.0, 0.0]
    assert b.exact_answer(["The answer is Paris."], ["paris"]) == [1.0]
    assert b.format_match(["1 + 2 = 3. The answer is 3.", "3"], pattern=r"(?:.*= -?\d+\. )*The answer is -?\d+\.") == [
        1.0,
        0.0,
    ]
    assert b.length_penalty([[1] * 5, [1] * 12], target=10, scale=0.5) == [0.0, -1.0]
    assert b.overlong([[1] * 10, [1] * 14, [1] * 17], max_length=16, cache=4) == [0.0, -0.5, -1.0]
    # "a b a b a": 3-grams (a b a), (b a b), (a b a): 2 distinct of 3 → −(1 − 2/3)
    assert b.repetition_penalty(["a b a b a", "a b"], n=3) == [pytest.approx(-1 / 3), 0.0]


def test_spec_arguments_bind_and_are_checked():
    [c] = parse_reward_specs(["tether.rewards.builtin:length_penalty(target=2,scale=1.0)=0.5"])
    assert c.name == "length_penalty" and c.weight == 0.5 and c.fn(completion_ids=[[1, 2, 3, 4]]) == [-2.0]
    with pytest.raises(ConfigError, match=r"exact_answer has no parameter \[.nonsense.\]"):
        parse_reward_specs(["tether.rewards.builtin:exact_answer(nonsense=1)"])
    # a value without its name was dropped, and the function ran with its default
    for spec in ("format_match('^[0-9]+$')", "length_penalty(10, scale=1.0)", "length_penalty(**{'target': 2})"):
        with pytest.raises(ConfigError, match="every argument needs its name"):
            parse_reward_specs([f"tether.rewards.builtin:{spec}"])
    from tether.config import _parse_list

    assert _parse_list("a:f(x=1,y=2)=0.5,b:g") == ["a:f(x=1,y=2)=0.5", "b:g"]


def test_a_hanging_function_times_out_as_documented(tmp_path):
    path = tmp_path / "slow.py"
    path.write_text(
        "import time\ndef hang(completions):\n    if any(completions):\n        time.sleep(30)\n"
        "    return [0.0] * len(completions)\n"
    )
    strict = RewardSet(parse_reward_specs([f"{path}:hang"]), columns=["prompt"], timeout=0.5)
    with pytest.raises(RewardFunctionError, match=r"hang raised TimeoutError: no result within 0.5 s"):
        strict.score(ROWS, ["x", "y"], [[1], [2]], [False, False])
    lenient = RewardSet(parse_reward_specs([f"{path}:hang"]), columns=["prompt"], timeout=0.5, on_error="score")
    assert lenient.score(ROWS, ["x", "y"], [[1], [2]], [False, False]) == {"hang": [0.0, 0.0]}
    assert lenient.components[0].errors == 1


def test_a_process_whose_reward_function_hung_still_exits(tmp_path):
    """The hung call is abandoned in a daemon thread: the process exits when its work is done, not after the call."""
    import subprocess
    import sys
    import time

    path = tmp_path / "forever.py"
    path.write_text(
        "import time\ndef hang(completions):\n    if any(completions):\n        time.sleep(600)\n"
        "    return [0.0] * len(completions)\n"
    )
    script = (
        "from tether.rewards.functions import RewardSet, parse_reward_specs\n"
        f"rs = RewardSet(parse_reward_specs([{str(path) + ':hang'!r}]), columns=['prompt'], timeout=0.3, "
        "on_error='score')\nprint(rs.score([{'prompt': 'p'}], ['x'], [[1]], [False]))"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "{'hang': [0.0]}" in done.stdout and time.monotonic() - start < 30


def test_async_functions_run_concurrently(tmp_path):
    import time

    path = tmp_path / "slow_async.py"
    path.write_text(
        "import asyncio\nasync def a(completions):\n    await asyncio.sleep(0.5)\n    return [1.0] * len(completions)\n"
        "async def b(completions):\n    await asyncio.sleep(0.5)\n    return [2.0] * len(completions)\n"
    )
    rs = RewardSet(parse_reward_specs([f"{path}:a", f"{path}:b"]), columns=["prompt"])
    start = time.perf_counter()
    assert rs.score(ROWS, ["x", "y"], [[1], [2]], [False, False]) == {"a": [1.0, 1.0], "b": [2.0, 2.0]}
    assert time.perf_counter() - start < 0.9  # both sleeps overlapped


def test_weak_sandbox_limits_time_and_memory_and_the_code_reward_uses_it():
    """The weak mode (named on purpose; no security boundary): time and memory limits. tests/test_sandbox.py
    checks the default, isolated sandbox against attacks."""
    from tether.rewards.builtin import python_tests
    from tether.rewards.sandbox import run_python

    assert run_python("print(6 * 7)", isolation="weak").stdout.strip() == "42"
    slow = run_python("while True: pass", timeout_s=0.5, isolation="weak")
    assert slow.timed_out and not slow.ok
    greedy = run_python("x = bytearray(2 * 1024 ** 3)", memory_mb=256, isolation="weak")
    assert not greedy.ok and "MemoryError" in greedy.stderr
    code = ["```python\ndef add(a, b):\n    return a + b\n```", "def add(a, b):\n    return a - b"]
    # a generous limit where the code must finish (a loaded CI machine starts Python slowly: 1 s once scored a right
    # answer 0), a short one where it must not
    assert python_tests(code, ["assert add(2, 3) == 5"] * 2, timeout_s=30.0, isolation="weak") == [1.0, 0.0]
    assert python_tests(["while True: pass"], ["assert add(2, 3) == 5"], timeout_s=0.5, isolation="weak") == [0.0]


def test_a_reward_file_that_does_not_import_is_named(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(completions):\n    return [0.0 for c in completions\n")
    with pytest.raises(ConfigError, match=r"broken.py:2: .*(never closed|invalid syntax)"):
        parse_reward_specs([f"{broken}:f"])
    failing = tmp_path / "failing.py"
    failing.write_text("import not_a_module_anywhere\n")
    with pytest.raises(ConfigError, match=r"failing.py:1: importing it raised ModuleNotFoundError"):
        parse_reward_specs([f"{failing}:f"])
    deeper = tmp_path / "deeper.py"  # the line of the user's file, not of Python's import machinery
    deeper.write_text("import os\n\nx = {}['missing']\n")
    with pytest.raises(ConfigError, match=r"deeper.py:3: importing it raised KeyError"):
        parse_reward_specs([f"{deeper}:f"])
    with pytest.raises(ConfigError, match=r"cannot import not_a_module_anywhere: ModuleNotFoundError"):
        parse_reward_specs(["not_a_module_anywhere:f"])


def test_a_hung_function_named_by_a_spec_is_killed_with_its_worker_process(tmp_path):
    import os

    path = tmp_path / "stuck.py"
    path.write_text(
        "import time\ncalls = []\ndef stuck(completions):\n    calls.append(1)\n"
        "    if completions and completions[0] == 'hang':\n        time.sleep(600)\n"
        "    return [float(len(calls))] * len(completions)\n"
    )
    rs = RewardSet(
        parse_reward_specs([f"{path}:stuck"]), columns=["prompt"], timeout=1.0, on_error="score", error_score=-1.0
    )
    assert rs.score(ROWS, ["x", "y"], [[1], [2]], [False, False]) == {"stuck": [1.0, 1.0]}  # state lives in the worker
    assert rs.score(ROWS, ["x", "y"], [[1], [2]], [False, False]) == {"stuck": [2.0, 2.0]}
    hung_pid = rs.worker.pid
    assert rs.score(ROWS, ["hang", "y"], [[1], [2]], [False, False]) == {"stuck": [-1.0, -1.0]}
    assert rs.components[0].errors == 1
    with pytest.raises(ProcessLookupError):
        os.kill(hung_pid, 0)  # the hung call's process is gone, not abandoned
    assert rs.score(ROWS, ["x", "y"], [[1], [2]], [False, False]) == {"stuck": [1.0, 1.0]}  # a fresh worker
    strict = RewardSet(parse_reward_specs([f"{path}:stuck"]), columns=["prompt"], timeout=1.0)
    with pytest.raises(
        RewardFunctionError, match="stuck raised TimeoutError: no result within 1 s .*worker process was killed"
    ):
        strict.score(ROWS, ["hang", "y"], [[1], [2]], [False, False])
    raising = tmp_path / "raising.py"
    raising.write_text("def boom(completions):\n    raise KeyError('missing')\n")
    with pytest.raises(RewardFunctionError, match="boom raised KeyError: 'missing'"):
        RewardSet(parse_reward_specs([f"{raising}:boom"]), columns=["prompt"], timeout=5.0).score(
            ROWS, ["x", "y"], [[1], [2]], [False, False]
        )


TRL_STYLE = """
def first_word_is_hi(completions, **kwargs):
    # written the TRL way for chat prompts: each completion is a list of messages
    return [1.0 if c[0]["content"].startswith("hi") else 0.0 for c in completions]

def answer_column(completions, answer, **kwargs):
    return [None if a is None else float(a in c[0]["content"]) for c, a in zip(completions, answer)]

def length(completions):
    return [float(len(c)) for c in completions]
"""


def test_reward_functions_written_the_trl_way_run_unchanged(tmp_path):
    """Chat prompts: a function that indexes completion[0]["content"] gets message lists (found by the dry call);
    one written for text keeps text; None is "no opinion", scored 0 and counted."""
    from types import SimpleNamespace

    import torch

    from tether.rewards.functions import load_reward_set
    from tether.rewards.score import Scorer

    (tmp_path / "trl_rewards.py").write_text(TRL_STYLE)
    rows = [
        {"prompt": [{"role": "user", "content": "Greet."}], "answer": "there"},
        {"prompt": [{"role": "user", "content": "Greet."}], "answer": None},
    ]
    specs = [f"{tmp_path}/trl_rewards.py:{name}" for name in ("first_word_is_hi", "answer_column", "length")]
    options = SimpleNamespace(reward=specs, reward_on_error="raise", reward_error_score=0.0, reward_timeout=0.0)
    rewards = load_reward_set(options, rows)
    assert [c.chat for c in rewards.components] == [True, True, False]
    rollout = SimpleNamespace(
        responses=["hi there", "go away"],
        prompts=["", ""],
        truncated=torch.tensor([False, False]),
        completion_ids=lambda: [[1], [2]],
        lengths=torch.tensor([2, 2]),
    )
    cfg = SimpleNamespace(
        reward_model_weight=1.0,
        penalize_truncated=False,
        truncation_penalty=-1.0,
        reward_clip=0.0,
        overlong_tokens=lambda n: 0,
    )
    scores = Scorer(cfg, 8, None, rewards)(rollout, rows)
    assert scores.parts["first_word_is_hi"].tolist() == [1.0, 0.0]
    assert scores.parts["answer_column"].tolist() == [1.0, 0.0] and scores.parts["length"].tolist() == [8.0, 7.0]
    assert scores.total.tolist() == [10.0, 7.0]
    assert Scorer(cfg, 8, None, rewards).error_counts() == {
        "first_word_is_hi": 0,
        "answer_column": 0,
        "length": 0,
        "answer_column/none": 1,
    }


def test_a_function_with_no_opinion_on_every_completion_is_named_before_and_during_training():
    """None means "no opinion" on one completion; None on all of them means the run would train on zeros."""
    undecided = RewardComponent("undecided", lambda completions: [None] * len(completions))
    with pytest.raises(ConfigError, match=r"undecided returned None \('no opinion'\) for every completion"):
        RewardSet([undecided], columns=["prompt"]).check(ROWS)
    # one function's Nones are fine while another one scores (a multi-task reward)
    scored = RewardComponent("scored", lambda completions: [0.0] * len(completions))
    RewardSet([undecided, scored], columns=["prompt"]).check(ROWS)


def _as_a_terminal_starts() -> None:
    """The child starts as a shell starts a foreground command: SIGINT at its default action and not blocked. A suite
    started in the background by a non-interactive shell (`make test &` in a script, `nohup … &`) runs with SIGINT
    ignored, as POSIX asks of asynchronous commands without job control; the ignoring is inherited across fork and
    exec, Python then installs no KeyboardInterrupt handler, and the run went on for thousands of steps after the
    SIGINT (measured: `bash -c 'python3 -c "import signal; print(signal.getsignal(signal.SIGINT))" & wait'` prints 1,
    SIG_IGN). A Ctrl-C at a terminal reaches a foreground command, which is what this test is about."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_in_grpo_prints_tethers_line_and_no_traceback_from_the_reward_worker(llama_dir, tmp_path):
    """Ctrl-C reaches the whole process group, the reward worker included: the worker ends quietly (before, a
    17-line KeyboardInterrupt traceback of it came first) and tether's one line is all that follows the progress."""
    import os
    import signal
    import subprocess
    import time

    from conftest import write_jsonl

    calls = tmp_path / "calls"
    (tmp_path / "rules.py").write_text(
        f"def count_a(completions):\n    with open({str(calls)!r}, 'a') as f:\n        f.write('x')\n"
        "    return [float(c.count('a')) for c in completions]\n"
    )
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Say {w}."} for w in ("cats", "dogs", "rain", "sun")])
    args = ["grpo", "--model", str(llama_dir), "--prompts", str(prompts), "--reward", f"{tmp_path}/rules.py:count_a"]
    args += ["--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--max-steps", "100000"]
    args += ["--output", str(tmp_path / "o"), "--report-to", "none", "--eval-every", "0", "--save-every", "0"]
    with (tmp_path / "err").open("w") as err:  # a file, not a pipe: nothing can hold the run on it
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", *args],
            stderr=err,
            start_new_session=True,
            preexec_fn=_as_a_terminal_starts,
        )
        deadline = time.time() + 120
        # the dry call runs in the trainer; the worker answers from step 1 on: 3 calls, and it waits for the next
        while proc.poll() is None and (not calls.is_file() or len(calls.read_text()) < 3) and time.time() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert proc.wait(60) == 130
    lines = (tmp_path / "err").read_text().splitlines()
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in lines), "\n".join(lines[-30:])
    assert lines[-1].startswith("tether grpo: interrupted at step "), lines[-5:]


def test_the_reward_worker_starts_without_importing_torch():
    """The worker's process imports tether.rewards on its way to its loader: torch there would cost every run's worker
    about 2 s of a CPU at each start (a user's reward module may import it; tether's own path does not)."""
    import subprocess

    code = "import sys, tether.rewards.worker, tether.rewards.loading; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
