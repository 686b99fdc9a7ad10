"""`tether report`: a self-contained page whose every metric is explained, alarms marked, several runs compared —
and loaded in a real headless Chromium: no console errors, and the screenshot shows the plots."""

import json
import re
import shutil
import subprocess

import pytest

from tether.diagnostics.report import Run, explain, load_glossary, render_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _run(folder, kl_coef, gold, proxy, kl, alarms=()):
    folder.mkdir(parents=True)
    rows = [
        {
            "step": 1,
            "eval0/gold_reward": gold[0],
            "eval0/score_mean": proxy[0],
            "score/mean": proxy[0],
            "kl/ref_mean": 0.0,
            "policy/entropy": 1.0,
        }
    ]
    for i in range(1, len(gold)):
        rows.append(
            {
                "step": 10 * i,
                "eval/gold_reward": gold[i],
                "eval/score_mean": proxy[i],
                "score/mean": proxy[i],
                "kl/ref_mean": kl[i],
                "policy/entropy": 1.0 - 0.1 * i,
                "kl/coef": kl_coef,
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "samples.jsonl").write_text(
        "".join(
            json.dumps({"step": 40, "prompt": "p", "response": f"answer {i}", "score": i / 10, "length": i}) + "\n"
            for i in range(12)
        )
    )
    (folder / "alarms.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alarms))
    (folder / "config.yaml").write_text(f"ppo:\n  kl_coef: {kl_coef}\n")
    return folder


# (gold reward, proxy score, KL to the reference) at steps 1, 10, 20, 30 and 40 of two PPO runs: without a KL penalty
# the proxy rises on while gold falls; with one (0.2) both level off
HACKED = ([1.85, 1.94, 1.60, 1.26, 0.17], [0.5, 0.97, 1.03, 1.06, 1.08], [0, 4, 16, 36, 67])
TIED = ([1.85, 2.05, 2.13, 2.03, 2.06], [0.5, 0.6, 0.7, 0.8, 0.85], [0, 0.3, 0.5, 0.6, 0.6])


@pytest.fixture
def two_runs(tmp_path):
    alarm = {
        "monitor": "proxy_up_task_down",
        "step": 20,
        "message": "gold fell while the proxy rose",
        "statistics": {"subject": "eval/gold_reward", "task_peak": 1.94},
        "samples": [{"response": "so long", "score": 1.2}],
    }
    hacked = _run(tmp_path / "ppo_kl0" / "run", 0.0, *HACKED, [alarm])
    tied = _run(tmp_path / "ppo_kl0.2" / "run", 0.2, *TIED)
    return hacked, tied


def test_every_metric_of_every_stage_is_in_the_glossary():
    glossary = load_glossary()
    for key in (
        "train/loss",
        "eval/loss",
        "score/mean",
        "kl/ref_mean",
        "policy/entropy",
        "advantage/min",
        "reward/arith_correct/mean",
        "eval/reward/arith_correct",
        "train/rewards/margins",
        "eval/rewards/accuracy",
        "eval/gold_win_rate",
        "groups/zero_variance_frac",
        "policy/clip_frac_low",
        "value/loss",
        "forwards/update",
        "positions/eval_sample",
    ):
        assert explain(key, glossary)[0], key
    assert explain("no/such/metric", glossary) == ("", "")


def test_the_page_is_self_contained_and_marks_alarms(two_runs):
    page = render_report(list(two_runs))
    assert "http://" not in page and "https://" not in page and "<script" not in page
    images = re.findall(r"src='data:image/png;base64,", page)
    assert len(images) >= 2 * 5 + 5 + 1  # per run, comparisons, the over-optimisation picture
    assert "Over-optimisation" in page and "proxy_up_task_down" in page and "gold fell while the proxy rose" in page
    assert "mean over responses of" in page  # kl/ref_mean's meaning from the glossary, under its plot


def _chromium(url, screenshot, tmp_path):
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--log-level=0",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1400,2200",
            f"--screenshot={screenshot}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (CI installs Debian's chromium)")
def test_the_report_loads_in_a_headless_browser_without_errors_and_shows_plots(two_runs, tmp_path):
    from PIL import Image

    from tether.cli import main

    out = tmp_path / "report.html"
    assert main(["report", *map(str, two_runs), "--output", str(out)]) == 0
    shot = tmp_path / "shot.png"
    result = _chromium(out.as_uri(), shot, tmp_path)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    assert _console_errors(result.stderr) == []
    # the detector is real: a page with a script error is caught
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>console.error('boom'); undefinedThing();</script></body></html>")
    assert _console_errors(_chromium(broken.as_uri(), tmp_path / "b.png", tmp_path).stderr)
    # the screenshot shows plots: matplotlib's line colours cover a visible part of the page
    import numpy as np

    px = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    r, g, b = px[..., 0], px[..., 1], px[..., 2]
    blue = int(((abs(r - 31) < 30) & (abs(g - 119) < 30) & (abs(b - 180) < 30)).sum())
    orange = int(((abs(r - 255) < 25) & (abs(g - 127) < 30) & (b < 60)).sum())
    assert blue > 1000 and orange > 200, (blue, orange)
    shutil.copy(shot, out.with_suffix(".png"))


def _loss_run(folder, stage_yaml: str, losses, summary_stage=None):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "train/loss": v}) + "\n" for i, v in enumerate(losses))
    )
    (folder / "config.yaml").write_text(stage_yaml)
    if summary_stage:
        (folder / "summary.json").write_text(json.dumps({"stage": summary_stage}))
    return folder


def test_each_stage_gets_its_own_loss_caption_and_loss_kinds_never_share_an_axis(tmp_path):
    """A DPO, a KTO and a reward-model run compared: train/loss is explained per stage (not SFT's caption for all)
    and drawn on three axes, one per kind of loss; a metric every run shares otherwise stays on one axis."""
    from tether.diagnostics.report import Run

    glossary = load_glossary()
    assert "trained tokens" in explain("train/loss", glossary, "sft")[0]
    assert "Bradley–Terry" in explain("train/loss", glossary, "rm")[0]
    assert "chosen loss" in explain("train/loss", glossary, "dpo")[0]
    assert explain("kto/reference_point", glossary, "dpo")[0].startswith("KTO's z_0")
    dpo = _loss_run(tmp_path / "dpo", "dpo:\n  loss: sigmoid\ndata:\n  path: p\n", [0.69, 0.6], "dpo")
    kto = _loss_run(tmp_path / "kto", "dpo:\n  loss: kto\ndata:\n  path: p\n", [0.5, 0.45])  # still running
    rm = _loss_run(tmp_path / "rm", "rm:\n  heads: [reward]\ndata:\n  path: p\n", [0.69, 0.5], "rm")
    assert [(Run(f).stage, Run(f).loss_kind) for f in (dpo, kto, rm)] == [
        ("dpo", "dpo sigmoid"),
        ("dpo", "dpo kto"),
        ("rm", "rm"),
    ]
    page = render_report([dpo, kto, rm])
    assert {"train/loss (dpo sigmoid)", "train/loss (dpo kto)", "train/loss (rm)"} <= set(
        re.findall(r"alt='([^']+)'", page)
    )
    assert "alt='train/loss'" not in page.split("<h2>Comparison</h2>")[1].split("<h2>")[0]
    assert "Bradley–Terry" in page and "trained tokens" not in page  # no run here is SFT


@pytest.mark.slow
def test_an_installed_wheel_captions_its_plots(tmp_path):
    """The glossary travels inside the package: a wheel built from the repository and installed elsewhere renders
    captions (tether/glossary.md links to docs/metrics.md; the wheel holds the file)."""
    import os
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, source / name)
    shutil.copytree(
        repo / "tether", source / "tether", symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    (source / "docs").mkdir()
    shutil.copy(repo / "docs" / "metrics.md", source / "docs" / "metrics.md")
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("tether-*.whl")
    target = tmp_path / "installed"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert (target / "tether" / "glossary.md").is_file() and not (target / "tether" / "glossary.md").is_symlink()
    run = _loss_run(tmp_path / "run", "dpo:\n  loss: sigmoid\ndata:\n  path: p\n", [0.69, 0.6], "dpo")
    script = (
        "import tether, tether.diagnostics.report as r, sys; assert tether.__file__.startswith(sys.argv[2]), tether.__file__; "
        "page = r.render_report([sys.argv[1]]); assert 'not in the glossary' not in page; "
        "print('chosen loss' in page)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", script, str(run), str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert shown.returncode == 0 and shown.stdout.strip() == "True", shown.stderr[-2000:]


def _reading(page: str, section: str) -> list[str]:
    """What a reader meets in ``section`` of the page, in order: group headings (as '# title'), plots (by key) and
    the groups' lines of unchanged metrics (as '= key value')."""
    found = re.findall(r"<h4>([^<]+)</h4>|alt='([^']+)'|<span title='[^']*'>([^<]+)</span>", section)
    return [f"# {h}" if h else plot or f"= {flat}" for h, plot, flat in found]


def test_a_dapo_run_reads_score_length_entropy_then_the_rest_with_flat_metrics_in_one_line(tmp_path):
    """A single run's page opens on its score, not on a flat `reward/exact/errors` panel; a run without a reference
    (DAPO, β = 0) shows no KL group; metrics that never moved take one line in their group, not a panel each; the
    work counted (forwards/*, positions/*) comes after the training figures, the alarm counters last."""
    run = tmp_path / "dapo"
    run.mkdir()
    rows = [
        {
            "step": step,
            "reward/exact/errors": 0,
            "reward/exact/mean": 0.1 * step,
            "score/mean": 0.1 * step - 0.05,
            "policy/entropy": 2.0 - 0.1 * step,
            "policy/ratio_mean": 1.0,
            "policy/clip_frac": 0.01 * step,
            "groups/zero_variance_frac": 0.5 - 0.1 * step,
            "rollout/length_mean": 10.0 + step,
            "lr": 1e-3,
            "forwards/update": 1,
            "positions/update": 100 + step,
            "time/update_s": 0.1 * step,
            **({"eval0/score_mean": 0.0} if step == 1 else {}),
            **({"eval/score_mean": 0.4} if step == 3 else {}),
        }
        for step in (1, 2, 3)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"stage": "grpo", "recipe": "dapo"}))
    page = render_report([run])
    assert _reading(page, page.split("<h3>Metrics</h3>")[1].split("<h3>Samples</h3>")[0]) == [
        "# Score and reward",
        "score/mean",
        "eval/score_mean",
        "reward/exact/mean",
        "# Length and entropy",
        "rollout/length_mean",
        "policy/entropy",
        "# Loss and optimisation",
        "policy/clip_frac",
        "groups/zero_variance_frac",
        "= lr 0.001",
        "= policy/ratio_mean 1",
        "# Time and work",
        "time/update_s",
        "positions/update",
        "= forwards/update 1",
        "# Alarm counters",
        "= reward/exact/errors 0",
    ]


def test_runs_with_a_reference_and_gold_read_score_gold_kl_entropy_on_each_page_and_in_the_comparison(two_runs):
    """Per run and in the comparison: score, gold, KL, entropy; kl/coef never moves within a run, so it is one line —
    in the comparison with each run's value, since they differ."""
    hacked, tied = two_runs
    page = render_report([hacked, tied])
    comparison, *per_run = page.split("<h2>")[2:]
    # the same groups in the comparison and on each run's page; only kl/coef's one line differs
    reading = lambda coef: [
        "# Score and reward",
        "score/mean",
        "eval/score_mean",
        "# Gold and task metrics",
        "eval/gold_reward",
        "# KL to the reference",
        "kl/ref_mean",
        f"= kl/coef {coef}",
        "# Length and entropy",
        "policy/entropy",
    ]
    assert _reading(comparison, comparison) == reading(f"{Run(hacked).name} 0, {Run(tied).name} 0.2")
    for section, coef in zip(per_run, ("0", "0.2")):
        assert _reading(section, section.split("<h3>Metrics</h3>")[1].split("<h3>Samples</h3>")[0]) == reading(coef)


def test_metric_groups_follow_the_reading_order_and_leave_out_empty_groups():
    from tether.diagnostics.report import metric_groups

    keys = [
        "reward/env/errors",
        "forwards/update",
        "positions/sample",
        "train/loss",
        "perf/tokens_per_s",
        "score/mean",
        "eval/accuracy_greedy",
        "eval/score_mean",
        "rollout/sampler_kl",
        "rollout/is_masked_share",
        "kl/ref_mean",
        "eval/gold_reward",
        "rollout/length_mean",
        "policy/entropy",
        "train/grad_norm",
        "policy/clip_frac",
        "agent/turns_mean",
        "reward/judge/none",
        "reward/judge/mean",
        "eval/overfit_alarm",
        "something/new",
    ]
    assert metric_groups(keys) == [
        ("Score and reward", ["score/mean", "eval/score_mean", "reward/judge/mean"]),
        ("Gold and task metrics", ["eval/gold_reward", "eval/accuracy_greedy"]),
        ("KL to the reference", ["kl/ref_mean"]),
        ("Length and entropy", ["rollout/length_mean", "policy/entropy"]),
        ("Loss and optimisation", ["train/loss", "train/grad_norm", "policy/clip_frac"]),
        ("Agents and environments", ["agent/turns_mean"]),
        (
            "Sampler (vLLM, --sampling-dtype) and the off-policy correction",
            ["rollout/sampler_kl", "rollout/is_masked_share"],
        ),
        ("Time and work", ["perf/tokens_per_s", "forwards/update", "positions/sample"]),
        ("Other", ["something/new"]),
        ("Alarm counters", ["reward/env/errors", "reward/judge/none", "eval/overfit_alarm"]),
    ]
