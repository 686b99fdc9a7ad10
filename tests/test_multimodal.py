"""Vision-language models in tether sft: three tiny random families (LLaVA, Idefics3, Gemma 3) built here, the data
shapes TRL and LLaMA-Factory write, the loss mask token by token, the images reaching the forward, the errors that
name a bad image, the vision tower's freezing, LoRA, resume and two processes."""

from __future__ import annotations

import base64
import io
import json
import re
from collections import Counter

import pytest
import torch
from conftest import FP64, flags, killed_after_step, write_jsonl
from PIL import Image
from test_sft import read_metrics, sft_config

from tether.data.images import PLACEHOLDER
from tether.data.multimodal import tokenize_multimodal
from tether.data.records import DataError, read_records
from tether.models.vision import TINY_VISION_FAMILIES, VISION_TOWER, load_processor
from tether.stages.sft import run_sft

COLOURS = {"red": (220, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 220)}

# The tokens each tiny family's processor writes for an image (models/vision.py), and how many of each a 32x32
# image gets, by hand: LLaVA, (28/7)² = 16 patches (CLIP's class token dropped); Idefics3, the image fits one 28²
# tile after resizing to 56 on its longest side, so 2x2 tiles and the global image, each 1 token ((28/14)² patches
# merged 2x2), framed by <fake_token_around_image> and a row/column or <global-img> token; Gemma 3, its begin and end
# tokens around mm_tokens_per_image = 4 soft tokens.
IMAGE_TOKENS = {
    "llava": {"<image>": 16},
    "idefics3": {"<image>": 5, "<global-img>": 1, "<fake_token_around_image>": 6},
    "gemma3": {"<start_of_image>": 1, "<image_soft_token>": 4, "<end_of_image>": 1},
}

# the newline tokens a processor writes around an image's own tokens (the text has newlines too: they are told
# apart by position, data/multimodal.py added_positions)
PROCESSOR_NEWLINES = {"llava": 0, "idefics3": 3, "gemma3": 4}


def png(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), COLOURS[colour]).save(buffer, format="PNG")
    return buffer.getvalue()


def colour_rows(folder, n: int) -> list[dict]:
    """TRL's shape: an images column (paths relative to the file) and image content parts."""
    (folder / "img").mkdir(exist_ok=True)
    for colour in COLOURS:
        (folder / "img" / f"{colour}.png").write_bytes(png(colour))
    rows = []
    for i in range(n):
        colour = list(COLOURS)[i % 3]
        question = [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": [{"type": "text", "text": f"It is {colour}."}]},
                ],
                "images": [f"img/{colour}.png"],
            }
        )
    return rows


@pytest.fixture
def colour_files(tmp_path):
    rows = colour_rows(tmp_path, 24)
    return write_jsonl(tmp_path / "train.jsonl", rows[:16]), write_jsonl(tmp_path / "eval.jsonl", rows[16:])


def vlm_config(model_dir, files, output, **train):
    return sft_config(model_dir, files, output, **{"data__max_length": 256, "train__max_steps": 2, **train})


def processor_of(model_dir):
    from tether.models.lm import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    return tokenizer, load_processor(model_dir, tokenizer)


def encode(model_dir, rows, path, **options):
    tokenizer, processor = processor_of(model_dir)
    records = read_records(write_jsonl(path, rows))
    return tokenizer, tokenize_multimodal(records, tokenizer, processor, 512, path=str(path), **options)


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_each_family_trains_on_its_images_and_writes_a_loadable_final(vlm_dirs, colour_files, tmp_path, family):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "run"
    summary = run_sft(vlm_config(vlm_dirs[family], colour_files, out))
    assert summary["steps"] == 2
    assert "16 images in 16 examples" in summary["data"][0] and "8 images in 8 examples" in summary["data"][1]
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2] and all(m["train/loss"] > 0 for m in metrics)
    model = AutoModelForImageTextToText.from_pretrained(out / "final")
    processor = AutoProcessor.from_pretrained(out / "final")
    assert hasattr(processor, "image_processor") and model.config.model_type == family
    config = (out / "config.yaml").read_text()
    assert "train_vision: false" in config


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_the_loss_covers_the_answer_and_never_an_image_token(vlm_dirs, tmp_path, family):
    rows = colour_rows(tmp_path, 1)
    tokenizer, (examples, report) = encode(vlm_dirs[family], rows, tmp_path / "one.jsonl")
    (example,) = examples
    ids, mask = example.input_ids, example.loss_mask
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "It is red.<|im_end|>"
    counts = {name: ids.count(tokenizer.convert_tokens_to_ids(name)) for name in IMAGE_TOKENS[family]}
    assert counts == IMAGE_TOKENS[family]
    # an image's tokens: its own, Idefics3's four tile markers, and the newlines the processor writes with them
    # (Idefics3: after each row of tiles and before the global image; Gemma 3: two before and two after)
    image = Counter({**IMAGE_TOKENS[family], "Ċ": PROCESSOR_NEWLINES[family]})
    if family == "idefics3":
        image.update(f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2))
    assert report.image_tokens == image.total()
    _, ([whole], whole_report) = encode(vlm_dirs[family], rows, tmp_path / "all.jsonl", train_on_prompt=True)
    # with --train-on-prompt every token is trained but the first and exactly the image's
    untrained = [t for position, (t, m) in enumerate(zip(whole.input_ids, whole.loss_mask)) if position and not m]
    assert Counter(tokenizer.convert_ids_to_tokens(untrained)) == +image
    assert whole_report.image_tokens == image.total()


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_the_images_reach_the_forward(vlm_dirs, tmp_path, family):
    """The same text with a red and with a blue image: the loss differs, so the pixels are in the forward."""
    from transformers import AutoModelForImageTextToText

    from tether.data.sft import collate
    from tether.train.lm_objective import SFTObjective

    rows = colour_rows(tmp_path, 1)
    blue = json.loads(json.dumps(rows[0]))
    blue["images"] = ["img/blue.png"]
    tokenizer, (examples, _) = encode(vlm_dirs[family], [rows[0], blue], tmp_path / "two.jsonl")
    assert examples[0].input_ids == examples[1].input_ids
    model = AutoModelForImageTextToText.from_pretrained(vlm_dirs[family]).eval()
    with torch.no_grad():
        red_loss, _ = SFTObjective().loss_sum(model, collate(examples[:1], tokenizer.pad_token_id))
        blue_loss, _ = SFTObjective().loss_sum(model, collate(examples[1:], tokenizer.pad_token_id))
        both, _ = SFTObjective().loss_sum(model, collate(examples, tokenizer.pad_token_id))
    assert abs(red_loss.item() - blue_loss.item()) > 1e-6
    # a padded batch of the two scores each row with its own image (a sum in float32: a few ulps of the sum apart)
    assert both.item() == pytest.approx(red_loss.item() + blue_loss.item(), rel=1e-5)


def test_data_check_counts_the_images_and_writes_each_images_tokens_once(vlm_dirs, colour_files, capsys):
    from tether.cli import main

    train_path, _ = colour_files
    assert main(["data", "check", str(train_path), "--model", str(vlm_dirs["llava"])]) == 0
    seen = capsys.readouterr()
    out = seen.out + seen.err
    assert "16 images in 16 examples, 256 image tokens (16 an image, 32% of the tokens)" in out
    assert "<image>×16What colour is it?" in out and "⟦It is red.<|im_end|>⟧" in out
    pairs = write_jsonl(train_path.parent / "check-pairs.jsonl", colour_pairs(train_path.parent, 8))
    assert main(["data", "check", str(pairs), "--model", str(vlm_dirs["llava"])]) == 0  # as tether dpo reads them
    seen = capsys.readouterr()
    out = " ".join((seen.out + seen.err).split())
    assert "8 images, 128 image tokens" in out and out.count("<image>×16What colour is it?") == 2, out[-1500:]


def test_the_shapes_trl_and_llamafactory_write_read_the_same(vlm_dirs, tmp_path):
    """One question about one image written five ways: TRL's images column with image parts, an image inside its
    part (a data: URI), OpenAI's image_url part, LLaMA-Factory's sharegpt file through dataset_info.json with an
    <image> placeholder, and Hugging Face datasets' {"bytes"} image object. Each gives the same tokens, mask and
    pixels."""
    model = vlm_dirs["idefics3"]
    trl = colour_rows(tmp_path, 1)[0]
    uri = "data:image/png;base64," + base64.b64encode(png("red")).decode()
    question = {"type": "text", "text": "What colour is it?"}
    answer = {"role": "assistant", "content": "It is red."}
    inline = {"messages": [{"role": "user", "content": [{"type": "image", "image": uri}, question]}, answer]}
    openai = {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}, question]}, answer]
    }
    hf_bytes = {**trl, "images": [{"bytes": png("red"), "path": None}]}
    hf_bytes["images"][0]["bytes"] = base64.b64encode(png("red")).decode()  # JSON holds the bytes as base64
    sharegpt = {
        "conversations": [
            {"from": "human", "value": f"{PLACEHOLDER}What colour is it?"},
            {"from": "gpt", "value": "It is red."},
        ],
        "pictures": ["img/red.png"],
    }
    write_jsonl(tmp_path / "lf.jsonl", [sharegpt])
    (tmp_path / "dataset_info.json").write_text(
        json.dumps(
            {
                "colours": {
                    "file_name": "lf.jsonl",
                    "formatting": "sharegpt",
                    "columns": {"messages": "conversations", "images": "pictures"},
                }
            }
        )
    )
    tokenizer, processor = processor_of(model)
    seen = []
    for name, records in [
        ("trl", read_records(write_jsonl(tmp_path / "trl.jsonl", [trl]))),
        ("inline", read_records(write_jsonl(tmp_path / "inline.jsonl", [inline]))),
        ("openai", read_records(write_jsonl(tmp_path / "openai.jsonl", [openai]))),
        ("bytes", read_records(write_jsonl(tmp_path / "bytes.jsonl", [hf_bytes]))),
        ("llamafactory", read_records(f"{tmp_path / 'dataset_info.json'}:colours")),
    ]:
        ([example], report) = tokenize_multimodal(records, tokenizer, processor, 512, path=name)
        assert report.images == 1, name
        seen.append((name, example))
    first = seen[0][1]
    for name, example in seen[1:]:
        assert example.input_ids == first.input_ids and example.loss_mask == first.loss_mask, name
        assert set(example.vision) == set(first.vision)
        assert all(torch.equal(example.vision[k], first.vision[k]) for k in first.vision), name


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_a_plain_prompt_takes_its_images_where_its_placeholders_are(vlm_dirs, tmp_path, family):
    colour_rows(tmp_path, 1)
    rows = [
        {
            "prompt": f"Colours: {PLACEHOLDER} then {PLACEHOLDER}. ",
            "completion": "red, blue",
            "images": ["img/red.png", "img/blue.png"],
        },
        {"prompt": "Colour: ", "completion": "green", "images": ["img/green.png"]},  # no placeholder: image first
    ]
    tokenizer, (examples, report) = encode(vlm_dirs[family], rows, tmp_path / "plain.jsonl")
    assert report.images == 3 and report.examples_with_images == 2
    for example, answer in zip(examples, ("red, blue", "green")):
        assert tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m]) == answer + "<|im_end|>"
    first_image = IMAGE_TOKENS[family]
    assert {n: examples[0].input_ids.count(tokenizer.convert_tokens_to_ids(n)) for n in first_image} == {
        n: 2 * c for n, c in first_image.items()
    }


def test_a_bad_image_or_placeholder_is_an_error_naming_the_record_and_field(vlm_dirs, tmp_path, llama_dir):
    model = vlm_dirs["llava"]
    good = colour_rows(tmp_path, 1)[0]
    path = tmp_path / "bad.jsonl"
    cases = [
        ({**good, "images": ["img/none.png"]}, r"bad\.jsonl:1: images\[0\]: image file 'img/none.png' not found", {}),
        (
            {**good, "images": [base64.b64encode(b"\x89PNG\r\n\x1a\n and then nothing").decode()]},
            r"bad\.jsonl:1: images\[0\]: not a readable image",  # a PNG's base64 by its start, broken after it
            {},
        ),
        (
            {**good, "images": [{"bytes": base64.b64encode(b"GIF89a broken").decode()}]},
            r"images\[0\]: not a readable image",
            {},
        ),
        (
            good,
            r"bad\.jsonl:1: images\[0\]: the image is 32x32 = 1024 pixels, over max_image_pixels=1000",
            {"max_pixels": 1000},
        ),
        (
            {**good, "images": ["img/red.png", "img/blue.png"]},
            r"bad\.jsonl:1: messages has 1 image placeholder\(s\) \(<image> or image parts\) for 2 image\(s\)",
            {},
        ),
        (
            {"prompt": f"{PLACEHOLDER}{PLACEHOLDER}Colour: ", "completion": "red", "images": ["img/red.png"]},
            r"bad\.jsonl:1: prompt has 2 <image> placeholder\(s\) for 1 image\(s\)",
            {},
        ),
    ]
    cases.append(
        (
            {**good, "images": ["iVBORw0KGgo!not base64!"]},
            r"images\[0\]: image text is neither a file path nor base64",
            {},
        )
    )
    # a message that is not an object, with images and without (a vision model reads every record this way)
    not_an_object = r"bad\.jsonl:1: field {}\[0\] must be an object with 'role' and 'content', got {}"
    cases += [
        ({**good, "messages": ["hello", good["messages"][1]]}, not_an_object.format("messages", "'hello'"), {}),
        ({"messages": [["user", "hi"], good["messages"][1]]}, not_an_object.format("messages", r"\['user'"), {}),
        ({"prompt": ["hi"], "completion": "red"}, not_an_object.format("prompt", "'hi'"), {}),
    ]
    for row, message, options in cases:
        with pytest.raises(DataError, match=message):
            encode(model, [row], path, **options)
    write_jsonl(path, [good])
    with pytest.raises(DataError, match=r"bad\.jsonl:1: the record has images, and .* is not a vision-language model"):
        run_sft(sft_config(llama_dir, (path, path), tmp_path / "text-only"))
    assert not (tmp_path / "text-only").exists()  # refused before the run folder is written


def test_a_vision_model_folder_without_its_processor_is_named(vlm_dirs, tmp_path):
    import shutil

    from tether.config import ConfigError

    folder = tmp_path / "no-processor"
    shutil.copytree(vlm_dirs["llava"], folder)
    (folder / "processor_config.json").unlink()
    with pytest.raises(ConfigError, match=r"no-processor: a vision-language model needs its processor"):
        processor_of(folder)


def test_a_text_model_refuses_images_by_name_in_every_stage(llama_dir, tmp_path, capsys):
    from tether.cli import main

    colour_rows(tmp_path, 1)
    pair = {"prompt": f"{PLACEHOLDER}Colour: ", "chosen": "red", "rejected": "blue", "images": ["img/red.png"]}
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [pair] * 8)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Colour: ", "images": ["img/red.png"]}] * 4)
    rules = tmp_path / "rules.py"
    rules.write_text("def one(completions, **kw):\n    return [1.0] * len(completions)\n")
    for stage, args, message in [
        ("rm", ["--data", pairs], r"pairs\.jsonl:1: the record has images, and .* is not a vision-language model"),
        ("dpo", ["--data", pairs], r"pairs\.jsonl:1: the record has images, and .* is not a vision-language model"),
        (
            "grpo",
            ["--prompts", prompts, "--reward", f"{rules}:one"],
            r"prompts\.jsonl:1: the row has images .*only a vision-language model",
        ),
    ]:
        out = tmp_path / stage
        assert main([stage, "--model", str(llama_dir), *map(str, args), "--output", str(out)]) == 2
        assert re.search(message, capsys.readouterr().err), stage
        assert not out.exists()


def colour_pairs(folder, n: int) -> list[dict]:
    """Multimodal preference pairs as docs/data.md builds them: one image, the right colour chosen, a wrong one
    rejected."""
    names = list(COLOURS)
    rows = []
    for row in colour_rows(folder, n):
        right = row["messages"][1]["content"][0]["text"].split()[-1].rstrip(".")
        wrong = names[(names.index(right) + 1) % 3]
        rows.append(
            {
                "prompt": row["messages"][:1],
                "chosen": [{"role": "assistant", "content": f"It is {right}."}],
                "rejected": [{"role": "assistant", "content": f"It is {wrong}."}],
                "images": row["images"],
            }
        )
    return rows


def dpo_overrides(model, folder, rows, out) -> dict:
    """Two steps of offline DPO on 16 of ``rows``, the other 8 held out."""
    return {
        "model.path": str(model),
        "data.path": str(write_jsonl(folder / "pairs.jsonl", rows[:16])),
        "data.eval_path": str(write_jsonl(folder / "eval.jsonl", rows[16:])),
        "train.output": str(out),
        "train.max_steps": 2,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "train.eval_every": 2,
        "train.report_to": ["none"],
        "optim.lr": 3e-3,
    }


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_dpo_on_each_family_starts_at_log_2_and_trains_on_its_images(vlm_dirs, tmp_path, family):
    import math

    from tether.config import build_config
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig

    overrides = dpo_overrides(vlm_dirs[family], tmp_path, colour_pairs(tmp_path, 24), tmp_path / "dpo")
    summary = run_dpo(build_config(DPOConfig, overrides=overrides))
    assert summary["steps"] == 2 and "16 images" in summary["data"][0]
    first, *_, last = read_metrics(tmp_path / "dpo")
    # step 0: the policy is the reference, so every reward is 0 and the loss log 2. The two are scored in differently
    # padded batches: their float32 sums of ~50 nats may differ by a few ulps (4e-6 each), β = 0.1 scales that into
    # the margin, and the loss moves by half the margin: far below 1e-5.
    assert first["eval0/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert abs(first["eval0/rewards/margins"]) < 1e-5
    assert last["eval/loss"] != first["eval0/loss"]
    from transformers import AutoModelForImageTextToText, AutoProcessor

    AutoModelForImageTextToText.from_pretrained(tmp_path / "dpo" / "final")
    assert hasattr(AutoProcessor.from_pretrained(tmp_path / "dpo" / "final"), "image_processor")


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_kto_on_each_family_starts_at_one_half_and_shows_each_rows_image_to_both_its_responses(
    vlm_dirs, tmp_path, family
):
    from tether.config import build_config
    from tether.data.dpo import tokenize_unpaired
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig

    rows = colour_pairs(tmp_path, 24)  # pairs, split into a desirable and an undesirable row each
    tokenizer, processor = processor_of(vlm_dirs[family])
    records = read_records(write_jsonl(tmp_path / "kto.jsonl", rows[:2]))
    examples, report = tokenize_unpaired(records, tokenizer, 512, processor=processor)
    assert report.images == 4 and [e.desirable for e in examples] == [True, False, True, False]
    for e in examples:  # the labelled answer and the next row's, both under this row's picture
        (own, other) = (r.vision["pixel_values"] for r in e.responses)
        assert torch.equal(own, other)
    red, blue = (examples[i].responses[0].vision["pixel_values"] for i in (0, 2))
    assert not torch.equal(red, blue)
    overrides = {**dpo_overrides(vlm_dirs[family], tmp_path, rows, tmp_path / "kto"), "dpo.loss": "kto"}
    assert run_dpo(build_config(DPOConfig, overrides=overrides))["steps"] == 2
    first, *_, last = read_metrics(tmp_path / "kto")
    # the policy is the reference: every reward and the reference point are 0, each loss 1 − σ(0) = 1/2, up to the
    # float32 ulps of the log-ratios (the DPO test's bound)
    assert first["eval0/loss"] == pytest.approx(0.5, abs=1e-5)
    assert last["eval/loss"] != first["eval0/loss"]


def test_a_pairs_reference_key_changes_with_its_image_and_the_unbuilt_paths_say_so(vlm_dirs, tmp_path):
    from tether.config import ConfigError, build_config
    from tether.data.dpo import data_fingerprint, tokenize_policy_preferences
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig

    model = vlm_dirs["llava"]
    tokenizer, processor = processor_of(model)
    rows = colour_pairs(tmp_path, 1)
    other = {**rows[0], "images": ["img/blue.png"]}  # the same texts, another image
    keys = []
    for row in (rows[0], other):
        records = read_records(write_jsonl(tmp_path / "p.jsonl", [row]))
        examples, _ = tokenize_policy_preferences(records, tokenizer, 512, processor=processor)
        keys.append(data_fingerprint(examples))
    assert keys[0] != keys[1]  # cached reference log-probs are never reused across images
    pairs = write_jsonl(tmp_path / "pairs.jsonl", colour_pairs(tmp_path, 8))
    base = {"model.path": str(model), "data.path": str(pairs), "train.report_to": ["none"]}
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Colour: "}] * 4)
    online = {**base, "online.online": True, "rollout.prompts": str(prompts), "train.output": str(tmp_path / "o")}
    online["judge.model"] = str(model)  # online DPO samples as GRPO does, and refuses what it refuses
    with pytest.raises(ConfigError, match=r"Not built yet: --judge-model \(it would judge the text alone"):
        run_dpo(build_config(DPOConfig, overrides={**online, "rewards.reward": [f"{tmp_path}/r.py:f"]}))
    assert not (tmp_path / "o").exists()


def test_the_vision_tower_is_frozen_unless_asked_and_lora_adapts_the_language_model_only(
    vlm_dirs, colour_files, tmp_path
):
    from transformers import AutoModelForImageTextToText

    model = vlm_dirs["llava"]
    before = AutoModelForImageTextToText.from_pretrained(model).state_dict()

    def changed(out):
        after = AutoModelForImageTextToText.from_pretrained(out / "final").state_dict()
        return {name for name in before if not torch.equal(before[name], after[name])}

    run_sft(vlm_config(model, colour_files, tmp_path / "frozen"))
    moved = changed(tmp_path / "frozen")
    assert moved and not any(VISION_TOWER.search(n) for n in moved)
    assert any("multi_modal_projector" in n for n in moved)  # the projector trains with the language model
    run_sft(vlm_config(model, colour_files, tmp_path / "trained", model__train_vision=True))
    assert any(VISION_TOWER.search(n) for n in changed(tmp_path / "trained"))

    from tether.models.lm import load_tokenizer, load_trainable_model

    lora = vlm_config(model, colour_files, tmp_path / "lora", model__lora_r=4, model__lora_alpha=8.0).model
    adapted = load_trainable_model(lora, load_tokenizer(model), None)
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any(VISION_TOWER.search(n) for n in trainable) and any("language_model" in n for n in trainable)
    run_sft(vlm_config(model, colour_files, tmp_path / "lora", model__lora_r=4, model__lora_alpha=8.0))
    merged = changed(tmp_path / "lora")  # final/ is the merged model: the language model's weights moved
    assert merged and not any(VISION_TOWER.search(n) or "lora_" in n for n in merged)


def test_a_killed_vlm_run_resumes_exactly(vlm_dirs, colour_files, tmp_path, monkeypatch):
    model = vlm_dirs["gemma3"]
    whole = tmp_path / "whole"
    run_sft(vlm_config(model, colour_files, whole, train__max_steps=4, train__save_every=2))
    killed = tmp_path / "killed"
    with killed_after_step(monkeypatch, 3), pytest.raises(KeyboardInterrupt):
        run_sft(vlm_config(model, colour_files, killed, train__max_steps=4, train__save_every=2))
    assert (killed / "checkpoint-2" / "processor_config.json").is_file()  # the processor travels with the weights
    summary = run_sft(
        vlm_config(model, colour_files, killed, train__max_steps=4, train__save_every=2, train__resume=True)
    )
    assert summary["resumed_from"] == 2
    for a, b in zip(read_metrics(whole), read_metrics(killed)):
        for key in ("train/loss", "train/grad_norm", "train/tokens"):
            assert a[key] == b[key], (a["step"], key)


@pytest.mark.slow
def test_a_vlm_on_two_processes_equals_one(vlm_dirs, colour_files, tmp_path):
    from test_online_parallel import launch

    model = vlm_dirs["idefics3"]
    train_path, eval_path = colour_files
    settings = dict(max_length=256, lr=3e-3, batch_size=8, micro_batch_size=2, save_every=0, report_to="none")
    run = dict(model=model, data=train_path, eval_data=eval_path, max_steps=2, eval_every=2, **settings)
    launch(flags("sft", **run, output=tmp_path / "two") + FP64)
    overrides = dict(train__micro_batch_size=2, train__eval_every=2, model__dtype="float64")
    run_sft(vlm_config(model, colour_files, tmp_path / "one", **overrides))
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert "2 x 2 x 2" in (tmp_path / "two" / "config.yaml").read_text()
    assert len(one) == len(two) == 2
    for a, b in zip(one, two):
        assert a["train/tokens"] == b["train/tokens"]
        # float64 sums of the same terms in another order: relative differences near 1e-15, far inside 1e-9
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-9)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-9)
    assert one[-1]["eval/loss"] == pytest.approx(two[-1]["eval/loss"], rel=1e-9)
