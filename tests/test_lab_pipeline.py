"""`tether lab --quick` end to end: stages, caching, resume of a killed stage, `tether eval`, determinism."""

import html
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import BF16_REFUSED, bf16_refused_here, flags, killed_after_step, metrics_but_timings

from tether.cli import main
from tether.config import ConfigError
from tether.lab.pipeline import run_lab
from tether.lab.settings import QUICK, lab_settings


@pytest.fixture(scope="module")
def quick_lab(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    return out, run_lab(out, QUICK)


# the stages after the SFT model's evaluation, in the plan's order
AFTER_EVAL = (
    "rm",
    "rm_filtered",
    "ppo_kl0",
    "ppo_kl0.2",
    "ppo_adaptive2",
    "grpo_outcome",
    "grpo_process",
    "dpo_sigmoid",
    "dpo_simpo",
    "dpo_sigmoid_nll",
    "dpo_sigmoid_unfiltered",
    "dpo_sigmoid_sft_samples",
    "dpo_sigmoid_online",
    "agent_world",
    "calc_sft",
    "shop_sft",
    "calc_grpo",
    "shop_state",
    "shop_claim",
)


@pytest.mark.slow
def test_quick_lab_runs_every_stage_and_sft_beats_base(quick_lab):
    out, summary = quick_lab
    assert list(summary["seconds"]) == ["world", "init", "pretrain", "sft", "eval", *AFTER_EVAL, "report"]
    for path in (
        "world/world.json",
        "pretrain/final/config.json",
        "sft/final/model.safetensors",
        "eval/sft.json",
        "summary.json",
        "sft/metrics.jsonl",
    ):
        assert (out / path).exists(), path
    ev = summary["eval"]
    # The fine-tuned model must be measurably better than the pretrained base on the held-out assist prompts.
    assert ev["sft"]["assist_sampled"]["gold_win_rate"] > 0.5
    assert ev["sft"]["assist_sampled"]["gold_reward"] > ev["base"]["assist_sampled"]["gold_reward"]
    assert ev["sft"]["arith_greedy"]["format_rate"] >= ev["base"]["arith_greedy"]["format_rate"] - 0.05


@pytest.mark.slow
def test_quick_lab_reward_models_are_judged_against_gold(quick_lab):
    out, summary = quick_lab
    rms = summary["reward_models"]
    assert rms["rm"]["min_agreement"] == 0 and rms["rm_filtered"]["min_agreement"] == QUICK.rm_min_agreement
    assert rms["rm_filtered"]["filtering"]["kept"] < rms["rm_filtered"]["filtering"]["of"]
    for r in rms.values():
        assert r["gold_pairs"] > 50 and r["gold_accuracy"] > 0.5  # better than chance against gold
        assert 0 <= r["rm_picks_longer"] <= 1 and -1 <= r["length_correlation"] <= 1
    assert (out / "rm" / "run" / "final" / "reward_normalization.json").is_file()


@pytest.mark.slow
def test_second_run_reuses_every_stage_and_a_changed_stage_reruns_identically(quick_lab):
    out, first = quick_lab
    again = run_lab(out, QUICK)
    assert all(cached for stage, cached in again["cached"].items() if stage != "report")  # the page is redrawn
    assert again["eval"] == first["eval"]
    # Redo SFT and eval from scratch: same seed, same figures.
    shutil.rmtree(out / "sft")
    (out / "eval" / "stage.json").unlink()
    redone = run_lab(out, QUICK)
    assert not redone["cached"]["sft"] and redone["cached"]["pretrain"]
    assert redone["eval"] == first["eval"]


@pytest.mark.slow
def test_the_quick_lab_says_in_its_first_and_last_lines_that_it_is_a_plumbing_check(quick_lab, capsys):
    """At its scale the quick lab learns nothing (docs/lab.md): it must not be read as the lessons."""
    from tether.lab.settings import LabConfig, plumbing_note

    out, first = quick_lab
    note = plumbing_note(QUICK)
    assert plumbing_note(LabConfig()) is None and "plumbing check" in note and "make lab" in note
    assert first["plumbing_check"] == note and "plumbing check" in (out / "report.html").read_text()
    capsys.readouterr()
    run_lab(out, QUICK)  # every stage cached: seconds
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0].startswith("tether lab: a plumbing check") and "make lab" in lines[0]
    assert "make lab" in lines[-1] and any(line.startswith("tether lab: a plumbing check") for line in lines[-3:])


@pytest.mark.slow
def test_eval_command_prints_and_writes_figures(quick_lab, tmp_path, capsys):
    out, _ = quick_lab
    target = tmp_path / "arith.json"
    sft_eval = flags("eval", model=out / "sft" / "final")
    assert main(sft_eval + flags(task="lab-arith", limit=20, output=target)) == 0
    figures = json.loads(target.read_text())
    assert figures["n"] == 20 and 0 <= figures["accuracy"] <= 1 and figures["decoding"]["temperature"] == 0.0
    said = capsys.readouterr()
    assert json.loads(said.out)["accuracy"] == figures["accuracy"]  # stdout: the JSON alone
    assert "  accuracy " in said.err and "tether eval: lab-arith on" in said.err  # stderr: the reader's summary
    target = tmp_path / "assist.json"
    assist = flags(task="lab-assist", reference=out / "pretrain" / "final", temperature="0.7", samples=2, limit=5)
    assert main(sft_eval + assist + flags(output=target)) == 0
    figures = json.loads(target.read_text())
    assert figures["n"] == 10 and "gold_win_rate" in figures and "distinct_2" in figures


def test_eval_command_rejects_rows_without_the_task_columns(llama_dir, tmp_path, capsys):
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps({"prompt": [{"role": "user", "content": "Compute 1 + 2."}]}) + "\n")
    assert main(["eval", "--model", str(llama_dir), "--task", "lab-arith", "--data", str(bad)]) == 2
    assert "rows.jsonl:1: lab-arith rows need 'prompt' and 'question'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_killed_training_stage_resumes_and_matches_the_uninterrupted_run(quick_lab, monkeypatch):
    out, first = quick_lab
    sft = out / "sft"
    reference = metrics_but_timings(sft)
    shutil.rmtree(sft)
    (out / "eval" / "stage.json").unlink()

    with killed_after_step(monkeypatch, 50), pytest.raises(KeyboardInterrupt):
        run_lab(out, QUICK)
    assert (sft / "checkpoint-40").is_dir() and not (sft / "stage.json").exists()

    resumed = run_lab(out, QUICK)
    assert not resumed["cached"]["sft"] and resumed["cached"]["pretrain"]
    assert metrics_but_timings(sft) == reference
    assert resumed["eval"] == first["eval"]


@pytest.mark.slow
def test_quick_lab_ppo_runs_report_proxy_and_gold_curves(quick_lab):
    from transformers import AutoModelForCausalLM

    out, summary = quick_lab
    runs = summary["ppo"]
    assert list(runs) == ["ppo_kl0", "ppo_kl0.2", "ppo_adaptive2"]
    for name, run in runs.items():
        assert [c["step"] for c in run["curve"]] == [0, 3, 6]
        assert run["curve"][0]["win_rate"] == 0.5  # step 0: the policy is the SFT model, answering the same seed
        assert run["curve"][0]["kl"] == 0.0 and run["final_kl"] >= 0
        assert sum(run["time_split"].values()) == pytest.approx(1.0) and run["steps_per_minute"] > 0
        assert run["best"]["metric"] == "eval/gold_reward"
        assert run["best"]["value"] == max(c["gold"] for c in run["curve"])
        AutoModelForCausalLM.from_pretrained(out / name / "run" / "final")
    assert runs["ppo_kl0"]["final_kl_coef"] == 0.0 and runs["ppo_kl0.2"]["final_kl_coef"] == 0.2
    assert runs["ppo_adaptive2"]["final_kl_coef"] != QUICK.ppo_adaptive_init  # the controller moved β


@pytest.mark.slow
def test_a_killed_ppo_stage_resumes_and_matches_the_uninterrupted_run(quick_lab, monkeypatch):
    out, first = quick_lab
    stage = out / "ppo_kl0.2"
    reference = metrics_but_timings(stage / "run")
    shutil.rmtree(stage)
    with killed_after_step(monkeypatch, 5), pytest.raises(KeyboardInterrupt):
        run_lab(out, QUICK)
    assert (stage / "run" / "checkpoint-3").is_dir() and not (stage / "stage.json").exists()
    resumed = run_lab(out, QUICK)
    assert not resumed["cached"]["ppo_kl0.2"] and resumed["cached"]["ppo_kl0"]
    assert metrics_but_timings(stage / "run") == reference
    assert resumed["ppo"]["ppo_kl0.2"]["curve"] == first["ppo"]["ppo_kl0.2"]["curve"]


@pytest.mark.slow
def test_quick_lab_grpo_runs_measure_held_out_accuracy(quick_lab):
    out, summary = quick_lab
    from tether.lab.evaluate import evaluate_task
    from tether.models.lm import load_model, load_tokenizer

    runs = summary["grpo"]
    assert list(runs) == ["grpo_outcome", "grpo_process"]
    rows = [json.loads(line) for line in (out / "world" / "arith_eval.jsonl").read_text().splitlines()][
        : QUICK.grpo_eval_problems
    ]
    tok = load_tokenizer(out / "sft" / "final")
    sft_greedy = evaluate_task(load_model(out / "sft" / "final", tok), tok, "lab-arith", rows)["accuracy"]
    for name, run in runs.items():
        assert [c["step"] for c in run["curve"]] == [0, 2, 4] and run["recipe"] == "grpo"
        assert run["start_accuracy_greedy"] == sft_greedy  # step 0 is the SFT model, measured the same way
        assert sum(run["time_split"].values()) == pytest.approx(1.0) and run["steps"] == 4
    samples = [json.loads(line) for line in (out / "grpo_process" / "run" / "samples.jsonl").read_text().splitlines()]
    assert all(
        isinstance(s["step_scores"], list) and s["step_scores"] for s in samples
    )  # the process reward's step scores
    outcome = [json.loads(line) for line in (out / "grpo_outcome" / "run" / "samples.jsonl").read_text().splitlines()]
    assert all("step_scores" not in s and set(s["parts"]) == {"arith_correct", "arith_format"} for s in outcome)


@pytest.mark.slow
def test_quick_lab_dpo_runs_report_gold_and_pair_figures(quick_lab):
    from transformers import AutoModelForCausalLM

    out, summary = quick_lab
    runs = summary["dpo"]
    assert list(runs) == [name for name in AFTER_EVAL if name.startswith("dpo_")]  # the plan's DPO stages, in order
    filtered = sum(1 for _ in (out / "rm_filtered" / "prefs_filtered.jsonl").open())
    every = sum(1 for _ in (out / "world" / "prefs.jsonl").open())
    assert runs["dpo_sigmoid"]["train_examples"] == filtered < runs["dpo_sigmoid_unfiltered"]["train_examples"] == every
    for name, run in runs.items():
        assert [c["step"] for c in run["curve"]] == [0, 2, 4]
        assert run["curve"][0]["win_rate"] == 0.5  # step 0 is the SFT model, answering the same seed as the reference
        AutoModelForCausalLM.from_pretrained(out / name / "run" / "final")
    assert runs["dpo_sigmoid"]["curve"][0]["chosen"] == pytest.approx(0.0, abs=1e-5)  # π = π_ref before training
    assert runs["dpo_simpo"]["beta"] == 2.0 and runs["dpo_sigmoid"]["beta"] == 0.1
    # the NLL-anchored run is sigmoid DPO on the same pairs with the chosen answers' NLL at the lab's weight
    nll_dpo = lambda name: yaml.safe_load((out / name / "run" / "config.yaml").read_text())["dpo"]["sft_coef"]
    assert nll_dpo("dpo_sigmoid_nll") == QUICK.dpo_nll_coef == 1.0 and nll_dpo("dpo_sigmoid") == 0.0
    assert runs["dpo_sigmoid_nll"]["train_examples"] == filtered and runs["dpo_sigmoid_nll"]["beta"] == 0.1
    online = runs["dpo_sigmoid_online"]["online_rounds"]
    assert len(online) == QUICK.dpo_online_rounds and all(r["prompts"] == QUICK.dpo_online_prompts for r in online)
    assert len(list((out / "dpo_sigmoid_online" / "run" / "rounds").glob("round-*.jsonl"))) == QUICK.dpo_online_rounds
    # the SFT model's own answers: the online run's labels drawn in one round before the first step, then every step
    once = runs["dpo_sigmoid_sft_samples"]["online_rounds"]
    assert [(r["round"], r["prompts"]) for r in once] == [(0, QUICK.dpo_online_rounds * QUICK.dpo_online_prompts)]
    assert len(list((out / "dpo_sigmoid_sft_samples" / "run" / "rounds").glob("round-*.jsonl"))) == 1
    metrics = [
        json.loads(x) for x in (out / "dpo_sigmoid_sft_samples" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == list(range(1, QUICK.dpo_steps + 1))
    sampled = [m["step"] for m in metrics if m["time/sample_s"] > 0.01]  # a round starts only with step 1
    assert sampled == [1]


@pytest.mark.slow
def test_quick_lab_agent_stages_run_episodes_with_tools_and_state_checks(quick_lab):
    out, summary = quick_lab
    runs = summary["agents"]
    assert list(runs) == ["calc_grpo", "shop_state", "shop_claim"]
    for name, run in runs.items():
        assert [c["step"] for c in run["curve"]] == [0, 1, 2] and run["steps"] == QUICK.agent_steps
        assert run["eval_prompts"] == (QUICK.calc_eval_problems if name == "calc_grpo" else QUICK.shop_eval_requests)
        samples = [json.loads(x) for x in (out / name / "run" / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == QUICK.agent_steps * QUICK.agent_prompts_per_step * QUICK.agent_group_size
        assert all({"turns", "calls", "success", "end", "final"} <= set(s["agent"]) for s in samples)
    assert (
        0.0 <= runs["calc_grpo"]["sft_accuracy_no_tools"] <= 1.0 and "accuracy_no_tools" in runs["calc_grpo"]["final"]
    )
    assert "claimed_unverified_rate" in runs["shop_claim"]["final"]  # the shop says whether a claim is backed
    demos = [json.loads(x) for x in (out / "agent_world" / "calc_sft.jsonl").read_text().splitlines()]
    assert any(m["role"] == "tool" for d in demos for m in d["messages"])  # some demonstrations use the tool
    headline = dict(summary["headline"])
    assert any(k.startswith("calculator:") for k in headline) and any(k.startswith("shop_claim") for k in headline)


@pytest.mark.slow
def test_quick_lab_ends_with_a_report_and_headline_figures(quick_lab):
    out, summary = quick_lab
    page = (out / "report.html").read_text()
    assert summary["report"] == str(out / "report.html")
    for family in ("KL coefficient sweep", "GRPO on arith", "The DPO family", "Agents: the calculator"):
        assert family in page
    assert page.count("data:image/png;base64,") >= 10 and "<script" not in page
    figures = dict(summary["headline"])
    assert any(k.startswith("ppo_kl0:") for k in figures) and any(k.startswith("grpo_outcome:") for k in figures)
    assert any(k.startswith("dpo_sigmoid_online:") for k in figures)
    # every lesson judged on this run's figures (a verdict, not "not measured": the quick lab runs every stage it
    # reads), in summary.json and on the page
    lessons = {lesson["name"]: lesson for lesson in summary["lessons"]}
    assert set(lessons) == {
        "grpo_outcome",
        "kl_rope",
        "overoptimisation",
        "dpo_pairs",
        "calculator",
        "shop_state",
        "shop_claim",
    }
    assert all(isinstance(lesson["holds"], bool) for lesson in lessons.values()), lessons
    assert all(html.escape(lesson["line"]) in page for lesson in lessons.values())
    # every metric any lab run logs has its line in the glossary (what the report prints under its plot)
    from tether.diagnostics.report import Run, explain, load_glossary

    glossary = load_glossary()
    for stage in [*summary["ppo"], *summary["grpo"], *summary["dpo"], *summary["agents"]]:
        missing = [k for k in Run(out / stage / "run").series() if not explain(k, glossary)[0]]
        assert not missing, (stage, missing)


@pytest.mark.slow
def test_the_lab_sft_stage_learns_under_bf16_autocast_as_in_fp32(quick_lab, tmp_path):
    """The quick lab's SFT stage again with --mixed-precision bf16: its held-out loss falls as the fp32 stage's
    did and ends within 3 % of it (bf16 rounding, not a different result)."""
    from tether.config import build_config
    from tether.stages.sft import SFTConfig, run_sft

    out, summary = quick_lab
    fp32 = [json.loads(x) for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    world = out / "world"
    overrides = {
        "model.path": str(out / "pretrain" / "final"),
        "data.path": str(world / "sft.jsonl"),
        "data.eval_path": str(world / "sft_eval.jsonl"),
        "data.max_length": QUICK.pack_length,
        "optim.lr": QUICK.sft_lr,
        "optim.warmup_ratio": 0.05,
        "train.output": str(tmp_path / "bf16"),
        "train.batch_size": QUICK.sft_batch,
        "train.micro_batch_size": QUICK.sft_batch,
        "train.max_steps": QUICK.sft_steps,
        "train.eval_every": max(1, QUICK.sft_steps // 4),
        "train.save_every": 0,
        "train.seed": QUICK.seed,
        "train.report_to": ["none"],
        "model.mixed_precision": "bf16",
    }
    if bf16_refused_here():  # a narrowed kernel path on a CPU with AMX: torch cannot run it there
        with pytest.raises(ConfigError, match=BF16_REFUSED):
            run_sft(build_config(SFTConfig, overrides=overrides))
        return
    run_sft(build_config(SFTConfig, overrides=overrides))
    bf16 = [json.loads(x) for x in (tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()]
    curve = lambda rows: [r["eval/loss"] for r in rows if "eval/loss" in r]
    assert len(curve(bf16)) == len(curve(fp32)) >= 3
    # it learns: the held-out loss falls at every evaluation, in both precisions (the first evaluation is at step
    # 20, after the steepest part; with the thin demonstrations' filler the quick world's loss then falls by about
    # 10 % more, 1.37 -> 1.24, so a fixed share of it would test the data rather than the precision)
    for rows in (bf16, fp32):
        assert all(b < a for a, b in zip(curve(rows), curve(rows)[1:])), curve(rows)
    assert curve(bf16)[-1] == pytest.approx(curve(fp32)[-1], rel=0.03)


def _figures(summary: dict, out) -> str:
    """Every family's figures as text, without wall-clock fields and with the lab folder's path replaced."""
    clock = ("minutes", "steps_per_minute", "time_split", "seconds")
    strip = lambda obj: (
        {k: strip(v) for k, v in obj.items() if k not in clock}
        if isinstance(obj, dict)
        else [strip(v) for v in obj]
        if isinstance(obj, list)
        else obj
    )
    families = ("world", "pretrain", "sft", "eval", "reward_models", "ppo", "grpo", "dpo", "agents")
    return json.dumps(strip({k: summary[k] for k in families}), sort_keys=True).replace(str(out), "LAB")


@pytest.mark.slow
def test_stages_on_two_workers_run_side_by_side_and_compute_the_same_figures(quick_lab, tmp_path):
    out, first = quick_lab
    lab = tmp_path / "lab"
    shutil.copytree(out, lab)
    for name in AFTER_EVAL:
        shutil.rmtree(lab / name)
    second = run_lab(lab, QUICK, workers=2)
    assert _figures(second, lab) == _figures(first, out)
    assert list(second["seconds"]) == list(first["seconds"])  # the plan's order, not the order stages ended in
    assert [n for n, cached in second["cached"].items() if not cached] == [*AFTER_EVAL, "report"]
    spans = {}
    for name in AFTER_EVAL:
        record = json.loads((lab / name / "stage.json").read_text())
        spans[name] = (record["began"], record["ended"])
        assert "lab: " + name in (lab / "logs" / f"{name}.log").read_text()  # the stage's own output, in its log
    # each stage starts after the stages it reads have ended, and some ran at the same time as another
    assert spans["rm_filtered"][1] <= spans["ppo_kl0"][0] and spans["calc_sft"][1] <= spans["calc_grpo"][0]
    assert any(a[0] < b[1] and b[0] < a[1] for x, a in spans.items() for y, b in spans.items() if x < y)


@pytest.mark.slow
def test_a_stage_that_fails_on_a_worker_names_itself_and_its_log(quick_lab, tmp_path, capsys):
    from tether.data.records import DataError

    out, _ = quick_lab
    lab = tmp_path / "lab"
    shutil.copytree(out, lab)
    shutil.rmtree(lab / "dpo_sigmoid")
    with (lab / "rm_filtered" / "prefs_filtered.jsonl").open("a") as f:
        f.write("{not json\n")
    with pytest.raises(DataError, match="prefs_filtered.jsonl"):
        run_lab(lab, QUICK, workers=2)
    err = capsys.readouterr().err
    assert f"lab: dpo_sigmoid failed; the end of {lab / 'logs' / 'dpo_sigmoid.log'}" in err
    assert "Traceback" in (lab / "logs" / "dpo_sigmoid.log").read_text()
    assert not (lab / "dpo_sigmoid" / "stage.json").exists()


def test_a_plan_whose_stage_needs_a_later_one_is_refused(tmp_path):
    from tether.lab.schedule import Stage, Stages

    plan = [
        Stage("a", {}, ("b",), None, lambda folder, resume: {}),
        Stage("b", {}, (), None, lambda folder, resume: {}),
    ]
    with pytest.raises(ValueError, match="stage 'a' needs \\['b'\\], which no earlier stage makes"):
        Stages(tmp_path).run_plan(plan)


def test_a_stage_is_computed_again_after_a_change_to_tethers_code(tmp_path, monkeypatch):
    """The stage cache keys on the code too: the same recipe is reused while the code is the same, and computed
    afresh once it changed — a user never reads figures an older build made."""
    from tether.lab import schedule

    calls = []

    def stage(folder, resume):
        calls.append(resume)
        return {"figure": len(calls)}

    assert schedule.Stages(tmp_path).run("s", {"lr": 1e-3}, stage)[1] == {"figure": 1}
    assert schedule.Stages(tmp_path).run("s", {"lr": 1e-3}, stage)[1] == {"figure": 1} and len(calls) == 1  # cached
    monkeypatch.setattr(schedule, "code_fingerprint", lambda: "another-build")
    assert schedule.Stages(tmp_path).run("s", {"lr": 1e-3}, stage)[1] == {"figure": 2}


def test_the_code_fingerprint_follows_python_sources_only(tmp_path):
    from tether.lab.schedule import code_fingerprint

    package = tmp_path / "pkg"
    (package / "stages").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "stages" / "b.py").write_text("y = 2\n")
    (package / "notes.md").write_text("a note\n")
    first = code_fingerprint(package)
    (package / "notes.md").write_text("another note\n")
    assert code_fingerprint(package) == first
    (package / "stages" / "b.py").write_text("y = 3\n")
    changed = code_fingerprint(package)
    assert changed != first
    (package / "stages" / "b.py").rename(package / "b2.py")  # same contents, another module: another build
    assert code_fingerprint(package) not in (first, changed)


def test_thin_demonstrations_leave_the_vocabulary_and_the_initial_model_as_they_were(tmp_path):
    """The init stage trains the tokenizer on the world without thin demonstrations: the same tokens, the same ids
    and the same random model whatever sft_assist_thin_fraction is, so only the SFT data differs."""

    from tether.lab.runners import init_stage
    from tether.lab.world import build_world
    from tether.models.lm import load_tokenizer

    made = {}
    for fraction in (0.0, 0.5):
        cfg = replace(
            QUICK,
            world=replace(QUICK.world, n_pretrain_arith=300, n_pretrain_assist=300, sft_assist_thin_fraction=fraction),
        )
        world, init = tmp_path / f"world{fraction}", tmp_path / f"init{fraction}"
        build_world(world, replace(cfg.world, seed=cfg.seed))
        init.mkdir()
        init_stage(init, world, cfg)
        made[fraction] = (
            load_tokenizer(init).get_vocab(),
            (init / "model.safetensors").read_bytes(),
            (world / "sft.jsonl").read_bytes(),
        )
        assert not (init / "vocabulary_world").exists()
    assert made[0.0][0] == made[0.5][0] and made[0.0][1] == made[0.5][1]
    assert made[0.0][2] != made[0.5][2]  # the SFT data did change


@pytest.mark.slow
def test_the_seeds_example_reuses_seed_0_and_states_the_spread(quick_lab, tmp_path):
    """examples/lab_seeds.py: seed 0 read from the lab folder's cached stages (its summary and stages left as they
    were), seed 1 a lab of its own; for two seeds the mean is (a + b) / 2 and the sample sd |a − b| / √2. Run on the
    base model (--base-only): the headline stages after it are run_lab's, which the quick lab itself runs."""
    import math
    import subprocess
    import sys
    from pathlib import Path

    out, summary = quick_lab
    before = {name: (out / name).read_bytes() for name in ("summary.json", "pretrain/stage.json")}
    script = Path(__file__).resolve().parent.parent / "examples" / "lab_seeds.py"
    argv = [sys.executable, str(script), "--quick", "--base-only", "--seeds", "0,1", "--lab", str(out)]
    proc = subprocess.run(argv + ["--json", str(tmp_path / "seeds.json")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {name: (out / name).read_bytes() for name in before} == before  # seed 0: the cached stages
    assert (Path(f"{out}-seed1") / "pretrain" / "stage.json").is_file()
    row = json.loads((tmp_path / "seeds.json").read_text())["figures"]["pretraining held-out loss at the end"]
    a, b = row["seeds"].values()
    assert a != b  # another world, another model
    assert row["mean"] == pytest.approx((a + b) / 2) and row["sd"] == pytest.approx(abs(a - b) / math.sqrt(2))
    assert "mean ± sample sd" in proc.stdout


@pytest.mark.slow
def test_the_spread_example_reruns_a_stage_per_draw_and_judges_its_lessons(quick_lab, tmp_path):
    """examples/lab_spread.py: the shop's state-rewarded stage from the quick lab's inputs, seed 0 on one thread.
    Through the draw's links to the lab's stages it computes what the lab's own stage computed (on two threads:
    these sizes add up in the same order on one thread or two, as the two-worker test finds for every stage)."""
    out, summary = quick_lab
    script = Path(__file__).resolve().parent.parent / "examples" / "lab_spread.py"
    spread = tmp_path / "spread"
    command = [sys.executable, str(script), "--quick", "--lab", str(out), "--output", str(spread)]
    command += ["--stages", "shop_state", "--seeds", "0", "--threads", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((spread / "spread.json").read_text())
    assert list(result["draws"]) == ["seed0-t1"]
    lab = summary["agents"]["shop_state"]
    own = [lab["start"]["success_rate"], lab["final"]["success_rate"]]
    assert result["draws"]["seed0-t1"]["figures"]["shop_state success start/end"] == own
    lesson = result["draws"]["seed0-t1"]["lessons"]["shop_state"]
    assert lesson["holds"] == next(x["holds"] for x in summary["lessons"] if x["name"] == "shop_state")
    assert "shop_state: holds on" in proc.stdout
    # the draw's folder reads the lab's stages through links and holds its own run of the chosen one
    draw = spread / "seed0-t1"
    assert (draw / "shop_sft").is_symlink() and not (draw / "shop_state").is_symlink()
    assert (draw / "shop_state" / "stage.json").is_file()


def test_a_spread_draw_is_keyed_on_the_lab_it_reads_and_its_links_follow_that_lab(tmp_path):
    """examples/lab_spread.py into one --output from two labs: the draw's links point into the lab of the call (an
    earlier call's links into another lab are replaced), and the stages it reads enter its recipe by their hashes,
    so a draw computed from lab A is not reused for lab B."""
    _, spread = _example("lab_spread")
    labs = {}
    for name, recipe_hash in (("A", "aaa"), ("B", "bbb")):
        labs[name] = tmp_path / name
        (labs[name] / "sft").mkdir(parents=True)
        (labs[name] / "sft" / "stage.json").write_text(json.dumps({"recipe_hash": recipe_hash}))
    out = tmp_path / "spread"
    for name, recipe_hash in (("A", "aaa"), ("B", "bbb")):
        folder = spread.draw_folder(labs[name], out, ["ppo_kl0"], seed=0, threads=1)
        assert (folder / "sft").resolve() == (labs[name] / "sft").resolve()
        assert spread.needs_hashes(folder, ("sft",)) == {"sft": recipe_hash}
    with pytest.raises(SystemExit, match="not finished"):
        spread.needs_hashes(folder, ("rm",))


def _example(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def test_the_seeds_example_takes_set_items_over_its_headline_choices():
    """examples/lab_seeds.py --set dpo_online=true (an item its headline also sets) runs the online DPO stage: the
    item wins, where it once made two values for one field (a TypeError). The headline leaves out every stage its
    figures do not read, DPO + NLL among them."""
    from tether.lab.settings import QUICK, lab_settings

    _, seeds = _example("lab_seeds")
    cfg = seeds.seed_config(QUICK, 3, lab_settings(["dpo_online=true", "pretrain_steps=7"]))
    assert (cfg.seed, cfg.dpo_online, cfg.pretrain_steps, cfg.dpo_unfiltered) == (3, True, 7, False)
    assert seeds.seed_config(QUICK, 0, {}).dpo_nll_coef == 0.0


def test_pairs_cut_from_a_ranking_and_their_agreement_with_gold_by_hand():
    """examples/listwise_on_lab.py: ranking [2, 0, 1] gives the ordered pairs (2,0), (2,1), (0,1), or first vs last
    (2,1); with gold [0, 1, 3] the consensus is right on (2,0) and (2,1) and wrong on (0,1)."""
    _, listwise = _example("listwise_on_lab")
    r = {"prompt": "p", "responses": ["a", "b", "c"], "ranking": [2, 0, 1], "gold": [0.0, 1.0, 3.0]}
    pairs = listwise.ranking_pairs([r], "all")
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("c", "a"), ("c", "b"), ("a", "b")]
    assert [(p["chosen"], p["rejected"]) for p in listwise.ranking_pairs([r], "best_worst")] == [("c", "b")]
    tied = {**r, "gold": [1.0, 1.0, 3.0]}  # (0,1) tied in gold: not counted
    assert listwise.consensus_gold_agreement([r]) == {"all pairs": pytest.approx(2 / 3), "best vs worst": 1.0}
    assert listwise.consensus_gold_agreement([tied]) == {"all pairs": 1.0, "best vs worst": 1.0}


@pytest.mark.slow
def test_the_listwise_label_budget_and_rm_overtraining_examples_run_on_the_quick_lab(quick_lab, tmp_path, monkeypatch):
    """The three comparison examples end to end on the quick lab: the rows each run trained on, the label budget's
    filter, and the over-trained reward model's curve, best step and judged best/ and final/. Each example's main()
    runs in this process, as its command line would (the start-up of three interpreters is what a subprocess adds)."""
    out, summary = quick_lab

    def run(name: str, *args: str) -> dict:
        path, module = _example(name)
        argv = [
            str(path),
            "--lab",
            str(out),
            "--output",
            str(tmp_path / name),
            "--json",
            str(tmp_path / f"{name}.json"),
        ]
        monkeypatch.setattr(sys, "argv", [*argv, *args])
        module.main()
        return json.loads((tmp_path / f"{name}.json").read_text())

    n = QUICK.world.n_rankings
    listwise = run("listwise_on_lab", "--steps", "2", "--batch", "4")["runs"]
    assert [listwise[k]["train_examples"] for k in ("listwise", "all pairs", "best vs worst")] == [n, 6 * n, n]
    assert all(r["final_win_rate"] is not None for r in listwise.values())

    budget = run(
        "label_budget_on_lab", "--labels", "40", "--dpo-steps", "2", "--ppo-steps", "2", "--prompts-per-step", "4"
    )
    kept = sum(1 for line in (tmp_path / "label_budget_on_lab" / "kept.jsonl").read_text().splitlines() if line)
    assert budget["labels"] == 40 and budget["kept"] == kept and 0 < kept <= 40
    rows = {r["method"]: r for r in budget["table"]}
    assert rows["offline DPO"]["kept"] == kept and rows["PPO β=0.2 (RM on them)"]["rm_calls"] == 2 * 4
    assert rows["online DPO (lab)"]["final_win_rate"] == summary["dpo"]["dpo_sigmoid_online"]["final_win_rate"]
    once = summary["dpo"]["dpo_sigmoid_sft_samples"]
    assert rows["offline DPO on SFT samples (lab)"]["final_win_rate"] == once["final_win_rate"]
    assert rows["offline DPO on SFT samples (lab)"]["kept"] == once["online_rounds"][0]["pairs"]

    over = run("rm_overtraining_on_lab", "--pairs", "40", "--epochs", "4", "--batch", "8", "--eval-every", "5")
    steps = [m["step"] for m in over["curve"]]
    assert steps == [5, 10, 15, 20]  # 40 pairs x 4 epochs / 8 per step
    best = max(over["curve"], key=lambda m: m["eval/accuracy"])
    assert over["best_step"] == best["step"] and set(over["gold"]) == {"best", "last"}
    if over["best_step"] == steps[-1]:  # best/ is then the final model
        assert over["gold"]["best"]["gold_accuracy"] == over["gold"]["last"]["gold_accuracy"]


@pytest.mark.slow
def test_the_pretraining_recipe_gives_each_seed_the_same_base_model_quality_at_the_quick_scale(quick_lab):
    """run_base on seed 1 next to the quick lab's seed 0 (seed 1's folder is the lab_seeds test's, so its stages are
    reused when that test ran first). At the quick scale (d 64, 1 M tokens) no recipe tried learns the arithmetic
    itself (greedy accuracy 0 on every seed: that is measured at full scale over three seeds, docs/lab.md), so what
    must hold on each seed is the held-out pretraining loss: measured 0.71-0.75 on seeds 0-2 with this recipe (500
    steps of 8 rows at lr 2e-3) and 1.73-1.75 with the old one (250 steps of 16 rows at lr 1e-3: the same tokens),
    which fails this test on any seed. A third seed cost 78 s of the suite's 15 minutes."""

    from tether.lab.pipeline import run_base

    out, summary = quick_lab
    losses = {0: summary["pretrain"]["eval/loss"]}
    for seed in (1,):
        base = run_base(f"{out}-seed{seed}", replace(QUICK, seed=seed))
        assert base["curve"][-1][1] == base["pretrain"]["eval/loss"]  # the curve ends at the stage's figure
        assert base["arith_greedy"]["n"] == QUICK.eval_arith and base["arith_greedy"]["format_rate"] >= 0.9
        assert base["arith_greedy"]["addition_steps"] + base["arith_greedy"]["subtraction_steps"] > 0  # written out
        losses[seed] = base["pretrain"]["eval/loss"]
    assert max(losses.values()) < 1.0, losses
    assert max(losses.values()) - min(losses.values()) < 0.1, losses
    assert (out / "pretrain" / "stage.json").is_file() and summary["eval"]["base"]["arith_greedy"]["format_rate"] >= 0.9


def test_lab_workers_must_be_a_count_of_processes(capsys):
    assert main(["lab", "--workers", "-1", "--output", "unused"]) == 2
    assert "--workers must be 0 (one per core) or a number of processes, got -1" in capsys.readouterr().err


def test_a_lab_setting_is_parsed_by_its_type_and_the_rest_refused_naming_the_item(capsys):
    assert lab_settings(
        ["pretrain_weight_decay=0", "pretrain_steps=8000", "pretrain_lr_schedule=constant", "agent_stages=false"]
    ) == {
        "pretrain_weight_decay": 0.0,
        "pretrain_steps": 8000,
        "pretrain_lr_schedule": "constant",
        "agent_stages": False,
    }
    for bad in ("world=1", "seed=2", "no_such_field=1", "pretrain_lr"):
        with pytest.raises(ConfigError, match=f"--set {bad}: expected FIELD=VALUE"):
            lab_settings([bad])
    for bad, kind in (("pretrain_steps=many", "an integer"), ("agent_stages=maybe", "true or false")):
        with pytest.raises(ConfigError, match=f"--set {bad}: {bad.split('=')[0]} must be {kind}"):
            lab_settings([bad])
    # the same parser behind `tether lab --set` and examples/lab_seeds.py --set: a clear error, no stage run
    assert main(["lab", "--quick", "--set", "pretrain_steps=many", "--output", "unused"]) == 2
    assert "--set pretrain_steps=many: pretrain_steps must be an integer, got 'many'" in capsys.readouterr().err
    script = Path(__file__).resolve().parent.parent / "examples" / "lab_seeds.py"
    done = subprocess.run(
        [sys.executable, str(script), "--set", "world=1", "--lab", "unused"], capture_output=True, text=True
    )
    assert done.returncode != 0 and "--set world=1: expected FIELD=VALUE" in done.stderr


def test_tether_lab_set_reaches_the_lab_config(monkeypatch, tmp_path):
    import tether.lab.pipeline as pipeline

    seen = {}
    monkeypatch.setattr(pipeline, "run_lab", lambda output, cfg, **kw: seen.update(output=output, cfg=cfg))
    assert (
        main(
            [
                "lab",
                "--quick",
                "--seed",
                "3",
                "--set",
                "pretrain_steps=7",
                "--set",
                "agent_stages=no",
                "--output",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert seen["cfg"] == replace(QUICK, seed=3, pretrain_steps=7, agent_stages=False)


def test_the_lab_precision_reaches_each_stage_by_what_it_does(quick_lab, tmp_path):
    """`--set precision=NAME`: the model's precision for every training stage, the sampler's only where a stage
    samples, the off-policy correction only where a policy-gradient loss takes it; the recipes follow, so a lab
    folder never reuses a stage trained in another precision."""
    from tether.lab import runners
    from tether.lab.plan import lab_plan
    from tether.lab.settings import LabConfig, precision_settings

    assert precision_settings("fp32", samples=True, policy_gradient=True) == {}
    assert precision_settings("autocast") == {"model.mixed_precision": "bf16"}
    assert precision_settings("bf16_sampling") == {}  # SFT, the reward model, offline DPO: nothing samples
    assert precision_settings("bf16_sampling", samples=True) == {"rollout.sampling_dtype": "bf16"}  # online DPO
    assert precision_settings("bf16_sampling", samples=True, policy_gradient=True) == {
        "rollout.sampling_dtype": "bf16",
        "rollout.off_policy_correction": "token_truncate",
        "rollout.is_ratio_max": 2.0,
    }
    with pytest.raises(ConfigError, match="LabConfig.precision='bf16': one of fp32, autocast, bf16_sampling"):
        LabConfig(precision="bf16")
    plans = {
        p: {s.name: s.recipe for s in lab_plan(tmp_path, replace(QUICK, precision=p))} for p in ("fp32", "autocast")
    }
    assert plans["fp32"]["pretrain"]["precision"] == "fp32" and plans["autocast"]["pretrain"]["precision"] == "autocast"
    # one real stage of the quick lab in bf16 sampling: its config says so, and its metrics log the gap it corrects
    out, _ = quick_lab
    bf16_sampling = replace(QUICK, precision="bf16_sampling")
    if bf16_refused_here():  # a narrowed kernel path on a CPU with AMX: torch cannot run it there
        with pytest.raises(ConfigError, match=BF16_REFUSED):
            runners.grpo_stage(tmp_path / "grpo", False, out, bf16_sampling, "outcome")
        return
    runners.grpo_stage(tmp_path / "grpo", False, out, bf16_sampling, "outcome")
    config = (tmp_path / "grpo" / "run" / "config.yaml").read_text()
    for line in ("sampling_dtype: bf16", "off_policy_correction: token_truncate", "is_ratio_max: 2.0"):
        assert line in config
    metrics = [json.loads(line) for line in (tmp_path / "grpo" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("rollout/sampler_kl" in m for m in metrics if m.get("step", 0) > 0)
    # online DPO samples in bf16 too, without the correction its loss refuses
    runners.dpo_stage(tmp_path / "dpo", False, out, bf16_sampling, "sigmoid", "online")
    config = yaml.safe_load((tmp_path / "dpo" / "run" / "config.yaml").read_text())
    assert config["rollout"]["sampling_dtype"] == "bf16" and config["rollout"]["off_policy_correction"] == ""
