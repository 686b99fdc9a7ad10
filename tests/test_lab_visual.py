"""The lab's visual world (tether/lab/scenes.py): gold of a caption by hand, the drawn pixels, the demonstrators and
annotator panels, the world's files; the image_blind_reward monitor on hand-made metrics; and `tether lab
--multimodal --quick` end to end (slow)."""

from __future__ import annotations

import json
import math
import random

import pytest

from tether.diagnostics.monitors import MonitorSettings, image_blind_reward
from tether.lab.scenes import (
    CAREFUL_PANEL,
    COLOURS,
    DETAIL_PANEL,
    IMAGE_SIZE,
    SKIM_PANEL,
    SceneWorldConfig,
    Thing,
    build_scene_world,
    candidate_captions,
    caption,
    caption_f1,
    caption_gold,
    demonstration,
    draw,
    scene_row,
)

SCENE = [Thing("red", "square", 0), Thing("blue", "circle", 3)]


def test_caption_gold_by_hand():
    # right: 2 of 2 named, nothing else: F1 = 2·2 / (2 + 2) = 1
    assert caption_gold("a red square and a blue circle.", SCENE).f1 == 1.0
    # one left out: 2·1 / (1 + 2) = 2/3, no hallucination
    terse = caption_gold("a red square.", SCENE)
    assert terse.f1 == pytest.approx(2 / 3) and terse.hallucination == 0.0 and terse.mentions == 1
    # one added: right 2, mentions 3: F1 = 4/5, hallucination 1/3
    added = caption_gold("a red square, a blue circle and a green triangle.", SCENE)
    assert added.f1 == pytest.approx(4 / 5) and added.hallucination == pytest.approx(1 / 3)
    # a wrong colour is a hallucinated mention and a missed object: right 1 of mentions 2: F1 = 2/4
    wrong = caption_gold("a green square and a blue circle.", SCENE)
    assert wrong.f1 == 0.5 and wrong.hallucination == 0.5
    # an object named twice counts once: right 1, mentions 2, objects 2
    assert caption_gold("a red square and a red square.", SCENE).f1 == 0.5
    assert caption_gold("nothing here", SCENE).f1 == 0.0
    assert caption_f1(["a red square."], [scene_row(SCENE)]) == [pytest.approx(2 / 3)]


def test_the_scene_is_drawn_where_its_objects_are():
    image = draw(SCENE)
    assert image.size == (IMAGE_SIZE, IMAGE_SIZE)
    assert image.getpixel((7, 7)) == COLOURS["red"]  # the top-left cell's square, at its centre
    assert image.getpixel((21, 21)) == COLOURS["blue"]  # the bottom-right cell's circle, at its centre
    assert image.getpixel((21, 7)) == (245, 245, 245) and image.getpixel((7, 21)) == (245, 245, 245)
    assert image.getpixel((17, 17)) == (245, 245, 245)  # a circle's bounding-box corner is background


def test_demonstrators_and_candidates():
    rng = random.Random(0)
    assert demonstration(rng, SCENE, terse=0.0, careless=0.0) == "a red square and a blue circle."
    assert demonstration(rng, SCENE, terse=1.0, careless=0.0) == "a red square."
    kinds = candidate_captions(random.Random(1), SCENE)
    assert kinds["right"] == caption([("red", "square"), ("blue", "circle")])
    golds = {k: caption_gold(v, SCENE) for k, v in kinds.items()}
    assert golds["missing"].mentions == 1 and golds["wrong_colour"].hallucination == 0.5
    assert golds["hallucinated"].mentions in (3, 4) and golds["hallucinated"].right == 2


def test_the_panels_by_hand():
    right = caption_gold("a red square and a blue circle.", SCENE)
    added = caption_gold("a red square, a blue circle and a green triangle.", SCENE)
    # careful: u = F1; σ((1 − 0.8) / 0.1) = σ(2)
    assert CAREFUL_PANEL[0].prob_first(right, added) == pytest.approx(1 / (1 + math.exp(-2)))
    # detail: u = F1 + 0.25·mentions: 1 + 0.5 vs 0.8 + 0.75; σ(−0.05 / 0.1) = σ(−0.5): the added object wins
    assert DETAIL_PANEL[0].prob_first(right, added) == pytest.approx(1 / (1 + math.exp(0.5)))
    # skim (never sees the picture): u = 0.25·mentions: 0.5 vs 0.75; σ(−2.5)
    assert SKIM_PANEL[0].prob_first(right, added) == pytest.approx(1 / (1 + math.exp(2.5)))
    wrong = caption_gold("a green square and a blue circle.", SCENE)  # a colour wrong: the same to a skimmer
    assert SKIM_PANEL[0].prob_first(right, wrong) == 0.5 and CAREFUL_PANEL[0].prob_first(right, wrong) > 0.99


def test_the_world_files_hold_out_their_evaluation_scenes(tmp_path):
    cfg = SceneWorldConfig(n_sft=40, n_sft_eval=5, n_rl=20, n_eval=10, n_pairs=30, n_pairs_eval=6)
    world = build_scene_world(tmp_path, cfg)
    assert world["counts"] == {
        "eval": 10, "rl": 20, "sft": 40, "sft_eval": 5,
        "prefs_careful": 30, "prefs_detail": 30, "prefs_skim": 30,
        "prefs_careful_eval": 6, "prefs_detail_eval": 6, "prefs_skim_eval": 6,
    }  # fmt: skip
    rows = {name: [json.loads(line) for line in (tmp_path / f"{name}.jsonl").open()] for name in world["counts"]}
    held = {json.dumps(r["scene"]) for r in rows["eval"]}
    assert len(held) == 10 and not held & {json.dumps(r["scene"]) for r in rows["rl"]}
    for careful, detail, skim in zip(rows["prefs_careful"], rows["prefs_detail"], rows["prefs_skim"]):  # one pair
        assert careful["images"] == detail["images"] == skim["images"]
        assert sorted(careful["kinds"]) == sorted(detail["kinds"]) == sorted(skim["kinds"])
    assert all((tmp_path / r["images"][0]).is_file() for r in rows["sft"] + rows["eval"])
    again = tmp_path / "again"
    build_scene_world(again, cfg)
    assert (again / "prefs_detail.jsonl").read_text() == (tmp_path / "prefs_detail.jsonl").read_text()


def test_the_image_blind_monitor_fires_at_the_first_evaluation_below_its_threshold():
    metrics = [{"step": 0, "eval0/reward/image_shift": 0.9}, {"step": 10, "eval/reward/image_shift": 0.5}]
    assert image_blind_reward(metrics, [], MonitorSettings()) == []
    metrics += [{"step": 20, "eval/reward/image_shift": 0.2}, {"step": 30, "eval/reward/image_shift": 0.1}]
    alarms = image_blind_reward(metrics, [], MonitorSettings())
    assert [(a.monitor, a.step) for a in alarms] == [("image_blind_reward", 20)]
    assert image_blind_reward(metrics, [], MonitorSettings(image_shift_min=0.05)) == []


@pytest.mark.slow
def test_the_quick_visual_lab_runs_every_stage_and_judges_every_lesson(tmp_path, capsys):
    from tether.cli import main

    assert main(["lab", "--multimodal", "--quick", "--output", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "visual" / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and len(summary["lessons"]) == 8
    for seed in ("0", "1"):
        means = summary["held_out_means"][seed]
        assert set(means) == {"sft", "grpo_gold", "grpo_careful", "grpo_detail", "grpo_skim", "dpo_careful"}
        assert all(0 <= m["f1"] <= 1 for m in means.values())
        runs = summary["runs"][seed]
        assert runs["grpo_detail"]["image_shift"] and not runs["grpo_gold"]["image_shift"]  # reward models only
    err = capsys.readouterr().err
    assert err.count("lesson ") >= 8
    page = (tmp_path / "visual" / "captions.html").read_text()  # each held-out scene's picture beside the captions
    assert page.count("<img src='data:image/png;base64,") == 2 * 6 and page.count("F1 ") == 2 * 6 * 6
    # the gold evaluation during training (CaptionEval, the alarms benchmark's label) on a model in hand draws the
    # captions the lab's evaluation of the saved model draws: the same F1 and hallucination means
    from transformers import AutoModelForImageTextToText

    from tether.lab.visual import QUICK_VISUAL, CaptionEval
    from tether.models.lm import load_tokenizer
    from tether.models.vision import never_sample_placeholders

    sft = tmp_path / "visual" / "seed-0" / "sft" / "final"
    model = AutoModelForImageTextToText.from_pretrained(sft).eval()
    never_sample_placeholders(model)
    eval_file = tmp_path / "visual" / "seed-0" / "world" / "eval.jsonl"
    figures = CaptionEval(sft, eval_file, QUICK_VISUAL.max_new_tokens)(model, load_tokenizer(sft), 0)
    saved = summary["held_out_means"]["0"]["sft"]
    assert round(figures["caption_f1"], 4) == saved["f1"]
    assert round(figures["caption_hallucination"], 4) == saved["hallucination"]
    assert figures["caption_f1_low"] <= figures["caption_f1"] <= figures["caption_f1_high"]
