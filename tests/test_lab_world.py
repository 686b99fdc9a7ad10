"""The lab's world: gold functions on hand-written answers, annotators against their configuration, determinism."""

import json
import math
import random

import pytest

from tether.algorithms.agreement import cohen_kappa, fleiss_kappa, landis_koch
from tether.lab import arith
from tether.lab.annotators import DEFAULT_PANEL, Annotator
from tether.lab.assist import AssistGold, distinct_n, gold_assist
from tether.lab.evaluate import score_arith, score_assist, written_step_accuracy
from tether.lab.world import WorldConfig, build_world, default_eval_rows

PROBLEM = arith.ArithProblem((47, 38, 19), ("+", "-"))


def test_arith_problem_and_solution():
    assert PROBLEM.question == "Compute 47 + 38 - 19."
    assert PROBLEM.answer == 66
    assert PROBLEM.solution() == "47 + 38 = 85. 85 - 19 = 66. The answer is 66."
    assert PROBLEM.solution(error_step=0, error_delta=10) == "47 + 38 = 95. 95 - 19 = 76. The answer is 76."
    assert arith.parse_question(PROBLEM.question) == PROBLEM


@pytest.mark.parametrize(
    "completion,correct,format_ok,steps",
    [
        ("47 + 38 = 85. 85 - 19 = 66. The answer is 66.", True, True, (True, True)),
        ("47 + 38 = 95. 95 - 19 = 76. The answer is 76.", False, True, (False, False)),  # a slip propagates
        ("47 + 38 = 85. 85 - 19 = 76. The answer is 76.", False, True, (True, False)),
        ("47 + 38 = 95. 85 - 19 = 66. The answer is 66.", True, True, (False, True)),  # right answer, wrong first step
        ("The answer is 66.", True, True, (False, False)),  # no worked steps
        ("It is 66.", False, False, (False, False)),
        (
            "47 + 38 = 85. 85 - 19 = 66. The answer is 66. Thanks!",
            False,
            False,
            (True, True),
        ),  # must end with the answer
        ("", False, False, (False, False)),
    ],
)
def test_arith_gold_on_hand_written_answers(completion, correct, format_ok, steps):
    gold = arith.check_arith(completion, PROBLEM)
    assert (gold.correct, gold.format_ok, gold.steps) == (correct, format_ok, steps)


def test_sampled_problems_stay_non_negative_and_in_range():
    rng = random.Random(0)
    for _ in range(500):
        p = arith.sample_problem(rng, 2, 4, 99)
        assert 2 <= len(p.operands) <= 4 and all(0 <= x <= 99 for x in p.operands)
        assert all(r >= 0 for r in p.partial_results())


def test_assist_gold_on_hand_written_answers():
    good = "Cats sleep for most of the day. Cats use their whiskers to feel space. I hope this helps!"
    assert gold_assist(good, "cats").reward == pytest.approx(2.0)  # 2 true facts, one free polite sentence
    confident = "Definitely, cats sleep for most of the day. Absolutely, cats use their whiskers to feel space."
    g = gold_assist(confident, "cats")
    assert g.reward == pytest.approx(2.0) and g.confident == 2  # confidence is worth nothing to gold
    # 1 true (+1), 1 false (-2), 1 off-topic true fact (-0.5), 1 filler (-0.3), a repeat (-0.5), a second polite (-0.3)
    messy = (
        "That is a great question. Cats sleep for most of the day. Cats can breathe under water. "
        "Dogs need a walk every day. Cats sleep for most of the day. Thanks for asking. Happy to help."
    )
    g = gold_assist(messy, "cats")
    assert (g.true_facts, g.false_facts, g.off_topic, g.filler, g.repeats) == (1, 1, 1, 2, 1)
    assert g.reward == pytest.approx(1 - 2 - 0.5 - 0.3 - 0.3 - 0.5)
    # more than 3 true facts are worth 3; an unknown sentence costs 0.5
    four = (
        "Cats sleep for most of the day. Cats clean their fur with their tongue. Cats can see well in dim light. "
        "Cats use their whiskers to feel space. Blah blah."
    )
    assert gold_assist(four, "cats").reward == pytest.approx(3 - 0.5)
    assert gold_assist("", "cats").reward == -1.0
    # length past 40 words: -0.05 per word
    long = " ".join(["Cats sleep for most of the day."] + ["Cats clean their fur with their tongue."] * 6)
    g = gold_assist(long, "cats")
    assert g.words == 7 + 6 * 7 and g.repeats == 5
    # the k-th repeat costs 0.5 · k: five repeats cost 0.5 + 1.0 + 1.5 + 2.0 + 2.5 = 7.5
    assert g.reward == pytest.approx(2 - 7.5 - 0.05 * (49 - 40))
    two = "Cats sleep for most of the day. Cats sleep for most of the day. Cats sleep for most of the day."
    assert gold_assist(two, "cats").reward == pytest.approx(1 - 0.5 - 1.0)


def test_the_worlds_answers_hold_at_most_one_repeat():
    """The escalating repeat cost reaches only answers outside the world's data (assist.py's docstring): every
    style the world samples appends at most one repeated sentence, so no annotator ever sees the second's price."""
    import random

    from tether.lab.assist import GOOD, MIXED, THIN, TOPICS, ResponseStyle, sample_answer

    rng = random.Random(0)
    repeats_always = ResponseStyle(repeat_prob=1.0)
    for style in (MIXED, GOOD, THIN, repeats_always):
        for topic in list(TOPICS)[:4]:
            for _ in range(200):
                assert gold_assist(sample_answer(rng, topic, style), topic).repeats <= 1


def test_distinct_2():
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)  # (a b), (b c), (a b), (b d)
    assert distinct_n(["x"], 2) == 0.0


def _gold(reward, words=10, confident=0):
    return AssistGold(reward, 0, 0, 0, 0, 0, 0, words, confident)


def test_annotator_choice_rates_match_their_configuration():
    rng = random.Random(1)
    n = 4000
    for ann in DEFAULT_PANEL:
        first, second = _gold(1.0, words=20, confident=1), _gold(1.5, words=12)
        expected = ann.prob_first(first, second)
        margin = (
            first.reward + ann.length_bias * 20 + ann.confident_bias + ann.position_bias - 1.5 - ann.length_bias * 12
        )
        assert expected == pytest.approx(ann.careless / 2 + (1 - ann.careless) / (1 + math.exp(-margin / ann.noise)))
        rate = sum(ann.choose_first(rng, first, second) for _ in range(n)) / n
        assert abs(rate - expected) < 4 * math.sqrt(expected * (1 - expected) / n), ann.name
    coin = Annotator("coin", careless=1.0)
    assert coin.prob_first(_gold(10.0), _gold(-10.0)) == 0.5


def test_plackett_luce_rankings_match_softmax_top_choice():
    rng = random.Random(2)
    ann = Annotator("pl", noise=1.0)
    golds = [_gold(0.0), _gold(1.0), _gold(2.0)]
    n = 6000
    tops = [ann.rank(rng, golds)[0] for _ in range(n)]
    z = sum(math.exp(g.reward) for g in golds)
    for i, g in enumerate(golds):
        p = math.exp(g.reward) / z
        assert abs(tops.count(i) / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_kappa_hand_computed():
    # 10 items: both say yes on 4, no on 3, disagree on 3 -> p_o = 0.7; a: 6 yes, b: 5 yes -> p_e = .6*.5+.4*.5 = .5
    a = [1, 1, 1, 1, 0, 0, 0, 1, 1, 0]
    b = [1, 1, 1, 1, 0, 0, 0, 0, 0, 1]
    assert cohen_kappa(a, b) == pytest.approx((0.7 - 0.5) / 0.5)
    assert cohen_kappa(a, a) == 1.0
    # Fleiss: 2 items, 3 raters. Item 1 all agree: P=1; item 2 split 2/1: P=(4+1-3)/6=1/3; P̄=2/3.
    # p = (5/6, 1/6); P̄e = 25/36 + 1/36 = 26/36; κ = (2/3 - 26/36) / (1 - 26/36) = (24-26)/10 = -0.2
    assert fleiss_kappa([[3, 0], [2, 1]]) == pytest.approx(-0.2)
    assert landis_koch(0.5) == "moderate" and landis_koch(-0.1) == "poor" and landis_koch(0.9) == "almost perfect"
    with pytest.raises(ValueError):
        fleiss_kappa([[3, 0], [1, 1]])


SMALL = WorldConfig(
    n_pretrain_arith=200,
    n_pretrain_assist=200,
    n_sft_arith=100,
    n_sft_assist=100,
    n_rl_arith=50,
    n_eval_arith=50,
    n_pairs=1500,
    n_pairs_eval=20,
    n_rankings=10,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("world")
    return folder, build_world(folder, SMALL)


def test_world_is_deterministic_and_seeded(world, tmp_path):
    folder, manifest = world
    again = build_world(tmp_path / "again", SMALL)
    assert again == manifest
    for name in manifest["counts"]:
        assert (folder / f"{name}.jsonl").read_bytes() == (tmp_path / "again" / f"{name}.jsonl").read_bytes()
    other = build_world(tmp_path / "other", WorldConfig(**{**SMALL.__dict__, "seed": 1}))
    assert (tmp_path / "other" / "prefs.jsonl").read_bytes() != (folder / "prefs.jsonl").read_bytes()
    assert other["recipe_hash"] != manifest["recipe_hash"]


def test_lazy_demonstrations_are_added_without_changing_anything_else(world, tmp_path):
    folder, manifest = world
    none = build_world(tmp_path / "none", WorldConfig(**{**SMALL.__dict__, "n_sft_arith_direct": 0}))
    for name in ("pretrain", "prefs", "arith_rl", "arith_eval", "rankings"):
        assert (folder / f"{name}.jsonl").read_bytes() == (tmp_path / "none" / f"{name}.jsonl").read_bytes(), name
    rows = lambda f, n: [json.loads(x) for x in (f / f"{n}.jsonl").read_text().splitlines()]
    lazy = lambda r: bool(arith.ANSWER_ONLY_RE.match(r["messages"][-1]["content"]))
    for split in ("sft", "sft_eval"):
        kept = [r for r in rows(folder, split) if not lazy(r)]
        assert sorted(map(json.dumps, kept)) == sorted(map(json.dumps, rows(tmp_path / "none", split)))
    n_lazy = sum(lazy(r) for split in ("sft", "sft_eval") for r in rows(folder, split))
    assert n_lazy == SMALL.n_sft_arith_direct and manifest["counts"]["sft"] > none["counts"]["sft"]


def test_thin_demonstrations_replace_assist_answers_and_nothing_else(tmp_path):
    from tether.lab import assist

    plain = build_world(tmp_path / "plain", WorldConfig(**{**SMALL.__dict__, "sft_assist_thin_fraction": 0.0}))
    thin = build_world(tmp_path / "thin", WorldConfig(**{**SMALL.__dict__, "sft_assist_thin_fraction": 0.5}))
    for name in ("pretrain", "prefs", "prefs_eval", "arith_rl", "assist_rl", "arith_eval", "assist_eval", "rankings"):
        assert (tmp_path / "plain" / f"{name}.jsonl").read_bytes() == (tmp_path / "thin" / f"{name}.jsonl").read_bytes()
    assert plain["counts"] == thin["counts"]
    topic = {text: t for t, text in assist.all_requests()}
    replaced = kept = 0
    for split in ("sft", "sft_eval"):
        before = [json.loads(x) for x in (tmp_path / "plain" / f"{split}.jsonl").read_text().splitlines()]
        after = [json.loads(x) for x in (tmp_path / "thin" / f"{split}.jsonl").read_text().splitlines()]
        for b, a in zip(before, after, strict=True):
            assert a["messages"][0] == b["messages"][0]  # the same request in the same place
            if b["messages"][0]["content"] not in topic or a == b:
                kept += b["messages"][0]["content"] in topic
                continue
            replaced += 1
            gold = assist.gold_assist(a["messages"][1]["content"], topic[a["messages"][0]["content"]])
            # one true fact, one or two filler sentences, nothing false: gold 1 - 0.3 x filler
            assert gold.true_facts == 1 and gold.false_facts == 0 and gold.filler in (1, 2)
            assert gold.reward == pytest.approx(1.0 - 0.3 * gold.filler)
    assert replaced + kept == SMALL.n_sft_assist
    assert 0.35 < replaced / SMALL.n_sft_assist < 0.65


def test_held_out_sets_are_held_out(world):
    folder, _ = world
    rows = {
        name: [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]
        for name in ("pretrain", "sft", "arith_rl", "arith_eval", "assist_eval", "assist_rl", "prefs")
    }
    seen_user_texts = {r["messages"][0]["content"] for n in ("pretrain", "sft") for r in rows[n]}
    seen_user_texts |= {r["prompt"][0]["content"] for n in ("arith_rl", "assist_rl", "prefs") for r in rows[n]}
    for name in ("arith_eval", "assist_eval"):
        assert rows[name] and not any(r["prompt"][0]["content"] in seen_user_texts for r in rows[name]), name
    assert default_eval_rows("lab-arith", SMALL) == rows["arith_eval"]
    assert default_eval_rows("lab-assist", SMALL) == rows["assist_eval"]


def test_preference_rows_keep_every_vote_and_majority_is_chosen(world):
    folder, _ = world
    for line in (folder / "prefs.jsonl").read_text().splitlines()[:200]:
        row = json.loads(line)
        assert set(row["votes"]) == {a.name for a in DEFAULT_PANEL}
        assert list(row["votes"].values()).count("chosen") >= 3
        assert row["chosen"] != row["rejected"]
    ranking = json.loads((folder / "rankings.jsonl").read_text().splitlines()[0])
    assert len(ranking["responses"]) == 4 and sorted(ranking["ranking"]) == [0, 1, 2, 3]


def test_majority_vote_inherits_length_and_confidence_bias(world):
    _, manifest = world
    stats = manifest["annotators"]
    for feature in ("longer", "more_confident"):
        assert stats["majority_bias"][feature]["excess"] > 0.05, stats["majority_bias"]
    per = stats["per_annotator"]
    assert per["careful"]["agreement_with_gold"] > per["careless"]["agreement_with_gold"] + 0.1
    assert 0.7 < stats["majority_agreement_with_gold"] < 0.95


def test_eval_scoring_hand_computed():
    rows = [{"question": PROBLEM.question}]
    figures = score_arith(rows, [[PROBLEM.solution(), "It is 66."]])
    assert figures == {"accuracy": 0.5, "format_rate": 0.5, "step_accuracy": 0.5, "worked_rate": 0.5, "n": 2}
    lazy = score_arith(rows, [[PROBLEM.direct_answer(), PROBLEM.solution(error_step=0, error_delta=10)]])
    assert lazy == {"accuracy": 0.5, "format_rate": 1.0, "step_accuracy": 0.0, "worked_rate": 0.5, "n": 2}


def test_written_steps_judge_the_models_own_arithmetic_per_operation():
    # 47 + 38 = 85 right; "85 - 19 = 76" wrong (66); a step on copied-wrong operands can still be right arithmetic.
    assert arith.written_steps("47 + 38 = 85. 85 - 19 = 76. The answer is 76.") == [("+", True), ("-", False)]
    assert arith.written_steps("47 + 39 = 86. 86 - 19 = 67. The answer is 67.") == [("+", True), ("-", True)]
    assert arith.written_steps("The answer is 66.") == []
    figures = written_step_accuracy(
        [
            ["47 + 38 = 85. 85 - 19 = 76. The answer is 76.", "The answer is 66."],
            ["10 + 5 = 16. 16 - 6 = 10. 10 - 3 = 7. The answer is 7."],
        ]
    )
    # additions: 85 right, 16 wrong -> 1 of 2; subtractions: 76 wrong, 10 right, 7 right -> 2 of 3
    assert figures == {
        "addition_steps": 2,
        "addition_steps_right": 0.5,
        "subtraction_steps": 3,
        "subtraction_steps_right": 2 / 3,
    }
    assert written_step_accuracy([["It is 66."]]) == {
        "addition_steps": 0,
        "addition_steps_right": 0.0,
        "subtraction_steps": 0,
        "subtraction_steps_right": 0.0,
    }
    rows = [{"topic": "cats"}]
    good = "Cats sleep for most of the day. Cats use their whiskers to feel space."
    bad = "Definitely, cats can breathe under water."
    figures = score_assist(rows, [[good, bad]], reference=[[bad, bad]])
    assert figures["gold_reward"] == pytest.approx((2.0 - 2.0) / 2)
    assert figures["gold_win_rate"] == pytest.approx((1.0 + 0.5) / 2)  # a win and a tie
    assert figures["false_fact_rate"] == 0.5 and figures["confident_rate"] == 0.5
    # one prompt: every resample draws it, so the interval is the point itself
    assert (figures["gold_win_rate_low"], figures["gold_win_rate_high"]) == (0.75, 0.75)
    assert (figures["gold_reward_low"], figures["gold_reward_high"]) == (0.0, 0.0)
    assert figures["gold_by_prompt"] == [[2.0, -2.0]]  # two true facts; a false fact said with confidence


def test_the_late_third_pools_each_prompts_answers_over_the_late_evaluations():
    """Evaluations at steps 0, 20, 40, 60 of a 60-step run: the late third is 40 and 60 (3 · 40 ≥ 2 · 60). Prompt A
    answers 1, 3 then 5; prompt B 2 then 0, 0: pooled mean (1 + 3 + 5 + 2 + 0 + 0) / 6 = 11/6. The bootstrap over
    two prompts draws A twice (mean 3) or B twice (mean 2/3) a quarter of the time each, else one of each (11/6):
    its 2.5 % and 97.5 % points are 2/3 and 3."""
    from tether.lab.rl import late_gold

    by_step = {0: [[9.0], [9.0]], 20: [[9.0], [9.0]], 40: [[1.0, 3.0], [2.0]], 60: [[5.0], [0.0, 0.0]]}
    late = late_gold(by_step, 60)
    assert late["steps"] == [40, 60]
    assert late["gold"] == pytest.approx(11 / 6, abs=1e-15)
    assert late["gold_ci"] == [pytest.approx(2 / 3, abs=1e-15), 3.0]
    # a 61-step run: 3 · 40 < 2 · 61, so 60 alone is late
    assert late_gold(by_step, 61)["steps"] == [60]
    assert late_gold({0: [[1.0]]}, 60) is None
    with pytest.raises(ValueError, match="different numbers of prompts"):
        late_gold({40: [[1.0]], 60: [[1.0], [2.0]]}, 60)
    # a step past the run's last (an earlier, longer run's record) is no evaluation of this run: a 45-step run's
    # late third is 30 and 40 of {20, 30, 40, 60} (3 · 30 ≥ 90), not 60
    assert late_gold({20: [[0.0]], 30: [[1.0]], 40: [[2.0]], 60: [[9.0]]}, 45) == {
        "steps": [30, 40],
        "gold": 1.5,
        "gold_ci": [1.5, 1.5],
    }


def test_a_lab_run_computed_afresh_starts_its_gold_record_afresh(tmp_path):
    """--overwrite removes a run's own files only: the gold record of an earlier run in the folder is removed by the
    lab when the run is computed afresh, and kept when it is resumed (its evaluations are this run's)."""
    import tether.lab.rl as rl

    rl.write_gold_by_prompt(tmp_path, 60, [[0.0]])
    rl.clear_gold_record(tmp_path, resume=True)
    assert rl.read_gold_by_prompt(tmp_path) == {60: [[0.0]]}
    rl.clear_gold_record(tmp_path, resume=False)
    assert rl.read_gold_by_prompt(tmp_path) == {}
    rl.clear_gold_record(tmp_path / "never-written", resume=False)  # nothing to clear is no error


def test_the_gold_evaluation_keeps_each_answers_gold_under_its_step(tmp_path, monkeypatch):
    """GoldAssistEval with a record folder writes one file per evaluation step; a resumed run that evaluates a step
    again replaces its file, and the reader returns step → gold per answer by prompt."""
    import tether.lab.rl as rl
    from tether.lab.evaluate import Decoding

    good = "Cats sleep for most of the day. Cats use their whiskers to feel space."
    bad = "Definitely, cats can breathe under water."
    gold = rl.GoldAssistEval.__new__(rl.GoldAssistEval)  # no SFT model to load: the reference answers are given
    gold.rows, gold.decoding, gold.record = [{"topic": "cats"}], Decoding(samples=2), tmp_path
    gold.reference = [[bad, bad]]
    answers = [[good, bad]]
    monkeypatch.setattr(rl, "generate_for", lambda policy, tokenizer, rows, decoding: answers)
    figures = gold(None, None, 10)
    assert "gold_by_prompt" not in figures and figures["gold_reward"] == 0.0
    answers = [[good, good]]
    gold(None, None, 20)
    gold(None, None, 20)  # evaluated again after a resume: the same file, written whole
    assert rl.read_gold_by_prompt(tmp_path) == {10: [[2.0, -2.0]], 20: [[2.0, 2.0]]}
    assert sorted(p.name for p in (tmp_path / rl.GOLD_BY_PROMPT).iterdir()) == ["step-000010.json", "step-000020.json"]
    assert rl.read_gold_by_prompt(tmp_path / "elsewhere") == {}


def test_the_sampled_accuracy_is_averaged_per_problem_and_its_standard_error_is_over_problems(monkeypatch):
    """ArithAccuracyEval with 2 answers per problem on scripted answers: problem 1 right 2/2, problem 2 right 1/2,
    problem 3 right 0/2. Accuracy = 3/6 = 0.5; per-problem means 1, 0.5, 0: s² = (0.25 + 0 + 0.25)/2 = 0.25,
    standard error √(0.25/3) = 0.288675. The count the monitors read stays 3 problems."""
    import tether.lab.rl as rl

    problems = [
        arith.ArithProblem((3, 4), ("+",)),
        arith.ArithProblem((9, 2), ("-",)),
        arith.ArithProblem((1, 1), ("+",)),
    ]
    rows = [{"prompt": [], "question": p.question, "answer": p.answer} for p in problems]
    wrong = lambda p: p.solution(error_step=0, error_delta=1)  # noqa: E731
    answers = {
        0.0: [[p.solution()] for p in problems],
        1.0: [[problems[0].solution()] * 2, [problems[1].solution(), wrong(problems[1])], [wrong(problems[2])] * 2],
    }
    monkeypatch.setattr(rl, "generate_for", lambda policy, tokenizer, rows, decoding: answers[decoding.temperature])
    figures = rl.ArithAccuracyEval(rows, 1.0, 0, 96, samples=2)(None, None, 0)
    assert figures["accuracy_sampled"] == pytest.approx(0.5, abs=1e-12)
    assert figures["accuracy_sampled_se"] == pytest.approx(0.288675, abs=1e-6)
    assert figures["accuracy_greedy"] == 1.0 and figures["accuracy_sampled_n"] == 3
    with pytest.raises(ValueError, match="samples must be at least 1"):
        rl.ArithAccuracyEval(rows, 1.0, 0, 96, samples=0)
