"""Vision-language policies online (tether grpo, and ppo with the shared critic) on three tiny random families: each
prompt's pixels reach every forward — sampling's prefill (the sampler's log-probs equal the trainer's, token by
token), the log-probs and the reference —, reward functions are given the images themselves (through the worker
process too), a bad image is named before the run folder exists, and what is not built yet is refused by name."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import write_jsonl
from test_multimodal import COLOURS, png

from tether.cli import main
from tether.data.prompts import prompt_rows
from tether.models.lm import load_tokenizer
from tether.models.vision import TINY_VISION_FAMILIES, load_processor, never_sample_placeholders, placeholder_ids
from tether.rollout.backends import HFGenerate
from tether.rollout.forward import response_logprobs
from tether.rollout.prompts import stop_token_ids
from tether.train.sampling import ImagePrompts

PIXELS = 16_777_216
# the reward reads the image: its top-left pixel's red channel, so a prompt's reward is known by hand (red 220, blue 20)
REDNESS = (
    "def redness(completions, images, **kw):\n"
    "    assert all(len(row) == 1 and row[0].mode == 'RGB' for row in images), images\n"
    "    return [row[0].getpixel((0, 0))[0] / 255 for row in images]\n"
    "def length(completions, **kw):\n"  # what varies within a group, so the advantages are not all 0
    "    return [len(c) / 100 for c in completions]\n"
)


def colour_prompts(folder, n: int = 8, name: str = "prompts.jsonl"):
    """TRL's shape: chat messages with an image part and an ``images`` column of paths relative to the file; the
    colours alternate red, blue."""
    (folder / "img").mkdir(exist_ok=True)
    for colour in COLOURS:
        (folder / "img" / f"{colour}.png").write_bytes(png(colour))
    question = [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]
    rows = [
        {"prompt": [{"role": "user", "content": question}], "images": [f"img/{('red', 'blue')[i % 2]}.png"]}
        for i in range(n)
    ]
    return write_jsonl(folder / name, rows)


def grpo_args(model_dir, prompts, rules, out, *extra) -> list[str]:
    return [
        "grpo",
        "--model", str(model_dir),
        "--prompts", str(prompts),
        "--eval-prompts", str(prompts),
        "--reward", f"{rules}:redness",
        "--prompts-per-step", "2",
        "--group-size", "2",
        "--max-new-tokens", "4",
        "--max-steps", "2",
        "--eval-every", "2",
        "--lr", "1e-3",
        "--report-to", "none",
        "--output", str(out),
        *extra,
    ]  # fmt: skip


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "rules.py"
    path.write_text(REDNESS)
    return path


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_grpo_on_each_family_sees_its_images_in_the_reward_and_writes_a_loadable_final(
    vlm_dirs, tmp_path, rules, capsys, family
):
    from transformers import AutoModelForImageTextToText

    prompts, out = colour_prompts(tmp_path), tmp_path / "run"
    assert main(grpo_args(vlm_dirs[family], prompts, rules, out)) == 0, capsys.readouterr().err
    err = "".join(capsys.readouterr().err.split())
    assert "8of8promptsshowimages,giventoeveryforward" in err  # the plan says where the images go
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # the default --reward-timeout calls the function in the worker process: the images travelled there as PNG text
    # and came back with their pixels; the eval prompts are 4 red and 4 blue, so the mean is (220 + 20) / 2 / 255
    assert metrics[-1]["eval/reward/redness"] == pytest.approx(120 / 255, abs=1e-6)
    assert AutoModelForImageTextToText.from_pretrained(out / "final").config.model_type == family


def sampling(**kw):
    return SimpleNamespace(
        **{"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "generation_batch": 0, **kw}
    )


def swapped_of(rollout, vision):
    """The rollout with each row shown the other colour (red <-> blue)."""
    swapped = rollout.select(torch.arange(len(vision)))
    swapped.vision = [vision[i ^ 1] for i in range(len(vision))]
    return swapped


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_the_sampler_sees_the_images_its_log_probs_are_the_trainers_and_another_image_changes_them(
    vlm_dirs, tmp_path, family
):
    """In float64: the prefill takes the pixels and the cached steps continue from them, so each sampled token's
    log-prob under the sampler equals the trainer's full forward with the pixels, up to the sampler's float32 softmax
    (2^-24 relative on logits of size ~1: 1e-5 is far above it); with the other colour's pixels the same tokens'
    log-probs move by far more."""
    from transformers import AutoModelForImageTextToText

    folder = vlm_dirs[family]
    tokenizer = load_tokenizer(folder)
    processor = load_processor(folder, tokenizer)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float64).eval()
    never_sample_placeholders(model)  # as the online stages load it
    rows = prompt_rows(colour_prompts(tmp_path, 4), images=PIXELS)
    prompts = ImagePrompts(tokenizer, processor, rows, "prompts.jsonl", PIXELS)
    encoded = [prompts.encode(i) for i in range(4)]
    contexts, vision = [ids for ids, _ in encoded], [v for _, v in encoded]
    stops = stop_token_ids(tokenizer, model)
    backend = HFGenerate(model, tokenizer, copy=True)  # keeps the sampler's log-probs
    rollout = backend.generate_ids(contexts, sampling(), stops, seeds=[1, 2, 3, 4], vision=vision)
    mask = rollout.response_mask.bool()
    assert mask.sum() >= 8 and not torch.isin(rollout.response_ids, torch.tensor(placeholder_ids(model.config))).any()
    with torch.no_grad():
        trainer = response_logprobs(model, rollout, 1.0)
        other = response_logprobs(model, swapped_of(rollout, vision), 1.0)
    assert float((trainer - rollout.sampler_logprobs)[mask].abs().max()) < 1e-5
    assert float((other - trainer)[mask].abs().max()) > 1e-3
    # greedy decoding with the cache drops finished rows; generate() runs every row: the same tokens with images
    greedy = [
        backend.generate_ids(contexts, sampling(drop_finished_rows=compact), stops, greedy=True, vision=vision)
        for compact in (True, False)
    ]
    assert torch.equal(greedy[0].response_ids, greedy[1].response_ids)
    # a separate critic (PPO's --critic-layout separate, from the policy folder): its backbone takes the pixels too
    from tether.stages.ppo_critic import load_value_model

    critic = load_value_model(folder, tokenizer, "float64")
    with torch.no_grad():
        torch.nn.init.normal_(critic.rm.score_head.weight)  # the new head starts at 0: give it a direction to read
        values, moved = critic(rollout), critic(swapped_of(rollout, vision))
    assert float((values - moved)[mask].abs().max()) > 1e-6 and (values[~mask] == 0).all()


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
@pytest.mark.parametrize("layout", ["shared", "separate"])
def test_ppo_trains_each_family_with_either_critic(vlm_dirs, tmp_path, rules, capsys, family, layout):
    """The value head reads the last hidden states of a forward that took the pixels: the policy's own (shared), or
    its own backbone's (separate: a vision-language model with tether's score head, from the policy folder)."""
    prompts = colour_prompts(tmp_path)
    ppo = grpo_args(vlm_dirs[family], prompts, rules, tmp_path / "ppo", "--critic-layout", layout)
    assert main(["ppo", *ppo[1:], "--reward", f"{rules}:length"]) == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(torch.isfinite(torch.tensor([m["value/loss"], m["policy/entropy"]])).all() for m in metrics)


@pytest.mark.parametrize("recipe", ["dapo", "dr_grpo", "gspo", "reinforce_pp", "rloo"])
def test_every_other_recipe_trains_a_vlm(vlm_dirs, tmp_path, rules, capsys, recipe):
    prompts = colour_prompts(tmp_path)
    args = grpo_args(vlm_dirs["idefics3"], prompts, rules, tmp_path / recipe, "--recipe", recipe)
    assert main([*args, "--reward", f"{rules}:length"]) == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (tmp_path / recipe / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and torch.isfinite(torch.tensor(metrics[-1]["policy/entropy"]))


def test_samples_name_each_prompts_image_and_the_report_shows_it_as_a_thumbnail(vlm_dirs, tmp_path, rules, capsys):
    import base64
    import io

    from PIL import Image

    from tether.data.images import sample_image_ref
    from tether.diagnostics.report import write_report

    prompts, out = colour_prompts(tmp_path), tmp_path / "run"
    assert main(grpo_args(vlm_dirs["llava"], prompts, rules, out, "--sample-every", "1")) == 0, capsys.readouterr().err
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {tuple(s["images"]) for s in samples} <= {(str(tmp_path / "img" / f"{c}.png"),) for c in ("red", "blue")}
    html = write_report([out], tmp_path / "report.html").read_text()
    thumbs = re.findall(r"<img class='thumb' src='data:image/png;base64,([^']+)'", html)
    assert thumbs  # the samples table shows each prompt's picture, shrunk from 32 to 64 px at most: kept at 32
    pictures = [Image.open(io.BytesIO(base64.b64decode(t))).convert("RGB") for t in thumbs]
    assert all(p.size == (32, 32) and p.getpixel((0, 0)) in (COLOURS["red"], COLOURS["blue"]) for p in pictures)
    inline = "data:image/png;base64," + base64.b64encode(png("red")).decode()
    ref = sample_image_ref(inline)  # an image held in the data: a thumbnail of it, not the image itself
    assert ref.startswith("data:image/png;base64,") and sample_image_ref(inline) is ref  # made once
    assert Image.open(io.BytesIO(base64.b64decode(ref.split(",")[1]))).getpixel((5, 5)) == COLOURS["red"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["grpo", "ppo", "grpo-worker"])
def test_a_vlm_online_on_two_processes_equals_one(together, request, tmp_path, stage):
    """Each process samples and scores its share of the prompts with their images; the gathered round carries every
    row's pixel tensors (train/parallel.py), so the updates equal the one-process run's (test_online_parallel.py's
    contract and tolerances, in float64). Without them the gathered rows lost their images: 1.6 % on a grad norm.
    grpo-worker: beside a rollout worker per process (--max-staleness 1), which each sends its share's pixels."""
    from test_online_parallel import assert_same_run, assert_written_once

    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    assert_written_once(two, 4, 2)
    samples = [json.loads(line) for line in (two / "samples.jsonl").read_text().splitlines()]
    assert all(len(s["images"]) == 1 for s in samples)  # each process's samples name their images


@pytest.fixture(scope="module")
def together(request, vlm_dirs, tmp_path_factory):
    """The two-process runs of test_a_vlm_online_on_two_processes_equals_one, made in one launch."""
    from conftest import FP64
    from test_online_parallel import Together

    root = tmp_path_factory.mktemp("colours")
    (root / "rules.py").write_text(REDNESS)
    prompts = colour_prompts(root)

    def args(stage: str) -> list[str]:
        extra = ["--reward", f"{root / 'rules.py'}:length", "--lr", "3e-3", "--sample-every", "1", "--response-seeds"]
        extra += [*FP64, *(["--critic-layout", "shared"] if stage == "ppo" else [])]
        if stage == "grpo-worker":
            stage, extra = "grpo", [*extra, "--max-staleness", "1", "--async-threads", "1"]
        args = [stage, *grpo_args(vlm_dirs["idefics3"], prompts, root / "rules.py", "-", *extra)[1:]]
        at = args.index("--output")
        return args[:at] + args[at + 2 :]  # Together names the folders

    table = {
        f"test_a_vlm_online_on_two_processes_equals_one[{stage}]": (lambda _, s=stage: args(s), [])
        for stage in ("grpo", "ppo", "grpo-worker")
    }
    return Together(request, table, None, tmp_path_factory.mktemp("two-processes"))


def test_the_rollout_worker_samples_each_row_with_its_own_images_and_its_log_probs_are_the_trainers(
    vlm_dirs, tmp_path, one_thread
):
    """The worker beside a float64 Idefics3 policy: each request's pixel tensors go to it in a file (a group's shared
    tensors once), its responses are the ones the trainer's own sampler draws with the same seeds, and its log-probs
    of them equal the trainer's full forward with each row's own image (1e-5, as the sampler test above) while the
    other colour's image moves them by more than 1e-3, so a row given another row's pixels would be caught."""
    from transformers import AutoModelForImageTextToText

    from tether.online_sections import SamplingSection
    from tether.rollout.async_worker import AsyncRolloutBackend

    folder = vlm_dirs["idefics3"]
    tokenizer = load_tokenizer(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float64).eval()
    never_sample_placeholders(model)
    rows = prompt_rows(colour_prompts(tmp_path, 4), images=PIXELS)
    prompts = ImagePrompts(tokenizer, load_processor(folder, tokenizer), rows, "prompts.jsonl", PIXELS)
    encoded = [prompts.encode(i) for i in (0, 0, 1, 1, 2, 3)]  # two groups of two, then a red and a blue row
    contexts, vision = [ids for ids, _ in encoded], [v for _, v in encoded]
    stops, seeds = stop_token_ids(tokenizer, model), [1, 2, 3, 4, 5, 6]
    settings = SamplingSection(max_new_tokens=6, max_staleness=1, async_threads=1)
    backend = AsyncRolloutBackend(model, tokenizer, settings)
    try:
        backend.prefetch_ids(contexts, stops, seeds, vision)  # queued ahead, then taken: one request, one file
        rollout = backend.generate_ids(contexts, settings, stops, seeds, vision=vision)
        assert backend.requests == 1 and not list(backend.slots.glob("pixels-*"))  # the worker removed the file
    finally:
        backend.close()
    mine = HFGenerate(model, tokenizer, copy=True).generate_ids(contexts, settings, stops, seeds, vision=vision)
    assert torch.equal(rollout.response_ids, mine.response_ids)
    mask = rollout.response_mask.bool()
    swapped = rollout.select(torch.arange(6))
    swapped.vision = [vision[i] for i in (2, 3, 0, 1, 5, 4)]  # each row shown the other colour
    with torch.no_grad():
        trainer = response_logprobs(model, rollout, 1.0)
        other = response_logprobs(model, swapped, 1.0)
    assert float((trainer - rollout.sampler_logprobs)[mask].abs().max()) < 1e-5
    assert float((other - trainer)[mask].abs().max()) > 1e-3


def test_one_rollout_worker_for_several_processes_is_refused_for_a_vlm_naming_the_layout_that_works(llama_dir):
    """rollout_workers = one on N processes: process 0 would need every process's pixel tensors (not built); the
    refusal comes before any worker starts, and names per_process. (A text policy takes the same layout.)"""
    from tether.errors import ConfigError
    from tether.models.lm import load_model, load_tokenizer
    from tether.online_sections import SamplingSection
    from tether.rollout.async_worker import AsyncRolloutBackend
    from tether.train.sampling import sampling_backend

    tokenizer = load_tokenizer(llama_dir)
    policy = load_model(llama_dir, tokenizer)
    settings = SamplingSection(max_staleness=1, rollout_workers="one")
    two = SimpleNamespace(active=True, rank=0, world=2)
    with pytest.raises(ConfigError, match="--rollout-workers one on several processes is not built for it yet"):
        sampling_backend(settings, policy, tokenizer, processor=object(), dp=two)
    backend = sampling_backend(settings, policy, tokenizer, processor=None, dp=two)
    assert isinstance(backend, AsyncRolloutBackend) and backend.one_worker and backend.process is None
    backend.close()


def test_a_requests_pixels_and_images_cross_to_the_worker_in_one_file_each_prompts_once(tmp_path):
    """write_pixels / read_pixels (rollout/worker_wire.py), by hand: rows 0-1 share one prompt's tensors (a group),
    row 2 has other tensors, row 3 no image; the shared tensors are written once, every row reads back its own values
    (and its RGB images, for a vLLM engine in the worker), the file is gone after reading."""
    import numpy as np
    from PIL import Image
    from safetensors import safe_open

    from tether.rollout.worker_wire import read_pixels, write_pixels

    red = {"pixel_values": torch.arange(6.0).reshape(1, 2, 3), "image_grid_thw": torch.tensor([[1, 2, 3]])}
    blue = {"pixel_values": -torch.arange(6.0).reshape(1, 2, 3), "image_grid_thw": torch.tensor([[1, 2, 3]])}
    pictures = [Image.new("RGB", (3, 2), (220, 0, 0)), Image.new("RGB", (3, 2), (0, 0, 220))]
    vision, images = [red, red, blue, None], [[pictures[0]], [pictures[0]], [pictures[1]], []]
    path = tmp_path / "request.safetensors"
    write_pixels(path, vision, images)
    with safe_open(str(path), "pt") as f:
        assert sorted(f.keys()) == [
            "0/image/0",
            "0/image_grid_thw",
            "0/pixel_values",
            "2/image/0",
            "2/image_grid_thw",
            "2/pixel_values",
        ]
    back, shown = read_pixels(str(path), 4)
    assert not path.exists() and back[3] is None and shown[3] == []
    for row in range(3):
        assert (
            all(torch.equal(back[row][k], vision[row][k]) for k in vision[row])
            and back[row].keys() == vision[row].keys()
        )
        assert [np.array(im).tolist() for im in shown[row]] == [np.array(im).tolist() for im in images[row]]
    write_pixels(path, vision)  # the hf worker's request: pixels only
    assert read_pixels(str(path), 4)[1] is None and read_pixels(None, 4) == (None, None)


@pytest.fixture
def one_thread():
    """The trainer on one thread, as the worker (--async-threads 1), so both sides reduce alike (as in
    test_async_rollouts.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_a_rollout_worker_samples_a_vlm_with_each_prompts_images_as_the_trainer_would(
    vlm_dirs, tmp_path, rules, capsys, one_thread, family
):
    """--max-staleness 1 through the stage: the first step's responses, scores and update equal the synchronous
    run's (the same weights, seeds and images), the next is drawn one update behind, the parity probe holds (the
    worker's copy never samples an image placeholder either), and the pixel files and weight slots are gone at the
    end. That each row reaches the worker with its own images: the test above."""
    from safetensors.torch import load_file

    prompts = colour_prompts(tmp_path)
    more = ("--reward", f"{rules}:length", "--response-seeds", "--sample-every", "1", "--save-every", "1")
    more += ("--keep-checkpoints", "2")
    sync, ahead = tmp_path / "sync", tmp_path / "ahead"
    assert main(grpo_args(vlm_dirs[family], prompts, rules, sync, *more)) == 0, capsys.readouterr().err
    worker = ("--max-staleness", "1", "--async-threads", "1")
    assert main(grpo_args(vlm_dirs[family], prompts, rules, ahead, *more, *worker)) == 0, capsys.readouterr().err
    read = lambda path: [json.loads(line) for line in path.read_text().splitlines()]  # noqa: E731
    first = [s for s in read(sync / "samples.jsonl") if s["step"] == 1]
    drawn = [s for s in read(ahead / "samples.jsonl") if s["step"] == 1]
    assert [(s["response"], s["score"]) for s in drawn] == [(s["response"], s["score"]) for s in first]
    one, other = (load_file(d / "checkpoint-1" / "model.safetensors") for d in (sync, ahead))
    assert all(torch.equal(one[k], other[k]) for k in one)
    metrics = read(ahead / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0]
    assert all(m["async/parity_max_diff"] <= 1e-6 for m in metrics)
    # the first step's weights are the trainer's: the two log-probs of each sampled token differ by float32 rounding
    assert metrics[0]["rollout/sampler_logprob_diff_max"] < 1e-4
    assert metrics[-1]["eval/reward/redness"] == pytest.approx(120 / 255, abs=1e-6)
    assert not list(Path("/dev/shm").glob(f"tether-weights-{os.getpid()}-*"))  # pixel files and slots removed


def test_a_bf16_sampling_copy_of_a_vlm_samples_with_the_images_and_logs_its_gap(vlm_dirs, tmp_path, rules, capsys):
    from conftest import BF16_REFUSED, bf16_refused_here

    args = grpo_args(vlm_dirs["gemma3"], colour_prompts(tmp_path), rules, tmp_path / "run", "--sampling-dtype", "bf16")
    if bf16_refused_here():
        assert main(args) == 2 and BF16_REFUSED in capsys.readouterr().err
        return
    assert main([*args, "--reward", f"{rules}:length"]) == 0, capsys.readouterr().err
    assert "abfloat16copyofthetrainedpolicy" in "".join(capsys.readouterr().err.split())
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the copy's log-probs of what it sampled (its pixels in its prefill) against the float32 trainer's with the same
    # pixels: bf16 moves them (nonzero), by far less than a wrong image or a missing one would on this model
    assert all(0 < m["rollout/sampler_logprob_diff_max"] < 0.5 for m in metrics), metrics


def test_grpo_with_lora_trains_a_vlm(vlm_dirs, tmp_path, rules, capsys):
    prompts, model = colour_prompts(tmp_path), vlm_dirs["llava"]
    lora = grpo_args(model, prompts, rules, tmp_path / "lora", "--lora-r", "4", "--reward", f"{rules}:length")
    assert main(lora) == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["kl/ref_mean"] == 0 and metrics[1]["kl/ref_mean"] > 0  # reference: the adapter switched off


def test_a_bad_image_and_what_is_not_built_are_named_before_the_run_folder(
    vlm_dirs, llama_dir, tmp_path, rules, capsys
):
    model = vlm_dirs["llava"]
    prompts = colour_prompts(tmp_path)
    lines = prompts.read_text().splitlines()
    bad = json.loads(lines[2])
    bad["images"] = ["img/missing.png"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([*lines[:2], json.dumps(bad), *lines[3:]]) + "\n")
    cases = [
        ([], broken, r"broken\.jsonl:3: images\[0\]: image file 'img/missing\.png' not found"),
        (
            ["--reward-model", str(llama_dir)],
            prompts,
            r"Not built yet: a text --reward-model \(it would score the text",
        ),
    ]
    for extra, file, message in cases:
        out = tmp_path / "out"
        assert main(grpo_args(model, file, rules, out, *extra)) == 2
        assert re.search(message, " ".join(capsys.readouterr().err.split())), extra
        assert not out.exists()


def rm_args(model_dir, train, evals, out, *extra) -> list[str]:
    return [
        "rm",
        "--model", str(model_dir),
        "--data", str(train),
        "--eval-data", str(evals),
        "--max-steps", "2",
        "--eval-every", "1",
        "--batch-size", "4",
        "--micro-batch-size", "2",
        "--lr", "3e-3",
        "--report-to", "none",
        "--output", str(out),
        *extra,
    ]  # fmt: skip


@pytest.fixture
def pair_files(tmp_path):
    from test_multimodal import colour_pairs

    rows = colour_pairs(tmp_path, 12)
    return write_jsonl(tmp_path / "pairs.jsonl", rows[:8]), write_jsonl(tmp_path / "held.jsonl", rows[8:])


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_a_reward_model_on_each_family_scores_with_the_image_as_grpo_then_reads_it(
    vlm_dirs, tmp_path, pair_files, capsys, family
):
    """tether rm on a vision-language backbone: tether's head on the language model's last state, the image probe in
    place of the text probes, final/ with the processor and the head reloaded bit for bit; then GRPO scored by it
    renders a response as the pairs were, so the reward of a held-out chosen answer is its held-out score, normalised."""
    from tether.data.preferences import tokenize_preferences
    from tether.data.records import read_records
    from tether.models.reward import RewardScorer, load_reward_model
    from tether.rewards.score import score_rows
    from tether.stages.rm_probes import preference_scores

    out = tmp_path / "rm"
    assert main(rm_args(vlm_dirs[family], *pair_files, out)) == 0, capsys.readouterr().err
    err = " ".join(capsys.readouterr().err.split())
    assert "another record's image moves a score by" in err
    summary = json.loads((out / "summary.json").read_text())
    image = summary["probes"]["image"]
    assert image["responses"] == 8 and image["mean_abs_shift"] > 0  # 4 held-out pairs; the pixels reach the head
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["tether_reward_heads"] == ["reward"] and (out / "final" / "reward_normalization.json").is_file()
    # held-out scores by the training code path, against the online scorer's for the chosen answers
    tokenizer = load_tokenizer(out / "final")
    processor = load_processor(out / "final", tokenizer)
    rm = load_reward_model(out / "final", tokenizer)
    records = read_records(pair_files[1])
    examples, _ = tokenize_preferences(records, tokenizer, 512, ["reward"], images=(processor, PIXELS))
    held = preference_scores(rm, examples, tokenizer.pad_token_id, 4, "cpu")[:, 0]  # chosen then rejected
    scorer = RewardScorer(out / "final")
    rows = prompt_rows(pair_files[1], images=PIXELS)
    chosen = [r["chosen"][0]["content"] for r in rows]
    online = torch.tensor(score_rows(scorer, rows, chosen, PIXELS))
    norm = summary["normalization"]["reward"]
    # compared in the model's own units: the two paths pad differently (other matmul shapes), so they may differ by
    # float32 rounding (2^-24 relative a step, over reductions 64 wide and two layers: well under 2e-6 of the scores'
    # size); a response rendered differently (another last token) moves a score by far more, as the rejected ones show
    raw, tolerance = online * norm["std"] + norm["mean"], 2e-6 * (1 + float(held.abs().max()))
    torch.testing.assert_close(raw, held[:4], rtol=0, atol=tolerance)
    assert float((held[:4] - held[4:]).abs().min()) > 10 * tolerance  # the rejected captions: other texts, other scores
    run = tmp_path / "grpo"
    args = grpo_args(vlm_dirs[family], colour_prompts(tmp_path), tmp_path / "unused.py", run)
    args[args.index("--reward") : args.index("--reward") + 2] = ["--reward-model", str(out / "final")]
    assert main(args) == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and "eval/reward/reward_model" in metrics[-1]


def test_a_lora_reward_model_on_a_vlm_adapts_the_language_model_only(vlm_dirs, tmp_path, pair_files, capsys):
    from tether.models.reward import apply_reward_lora, load_reward_model
    from tether.models.vision import VISION_TOWER

    rm = load_reward_model(vlm_dirs["llava"], load_tokenizer(vlm_dirs["llava"]))
    lora = apply_reward_lora(rm, 4, 8.0, 0.0, ["all-linear"])
    trained = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trained) and any(
        n.endswith("score.modules_to_save.default.weight") for n in trained
    )
    assert not [n for n in trained if VISION_TOWER.search(n)]
    out = tmp_path / "lora"
    assert main(rm_args(vlm_dirs["llava"], *pair_files, out, "--lora-r", "4")) == 0, capsys.readouterr().err
    assert load_reward_model(out / "final", load_tokenizer(out / "final")).head_names == ["reward"]


def test_data_check_of_a_prompt_file_with_images_counts_them_in_the_prompts_tokens(vlm_dirs, tmp_path, capsys):
    prompts = colour_prompts(tmp_path, 4)
    assert main(["data", "check", str(prompts), "--model", str(vlm_dirs["llava"])]) == 0
    captured = capsys.readouterr()
    out = " ".join((captured.out + captured.err).split())
    # LLaVA widens the image's one placeholder into (28/7)² = 16 tokens (test_multimodal.py IMAGE_TOKENS): 15 more
    tokenizer = load_tokenizer(vlm_dirs["llava"])
    rows = prompt_rows(prompts, images=PIXELS)
    processor = load_processor(vlm_dirs["llava"], tokenizer)
    text = ImagePrompts(tokenizer, processor, rows, "p", PIXELS).texts[0]
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 15
    assert f"4 RL prompts (chat messages); prompt tokens min {n}, mean {n}.0, max {n}" in out
    assert "4 show images" in out


def test_a_killed_vlm_grpo_run_resumes_exactly(vlm_dirs, tmp_path, rules, monkeypatch):
    """The checkpoint holds the processor beside the weights; the resumed run's every logged figure (times aside)
    equals the uninterrupted run's."""
    from conftest import killed_after_step, metrics_but_timings

    prompts = colour_prompts(tmp_path)

    def run(out, *extra):
        args = grpo_args(vlm_dirs["gemma3"], prompts, rules, out, "--max-steps", "4", "--save-every", "2", *extra)
        return main([*args, "--reward", f"{rules}:length"])

    assert run(tmp_path / "whole") == 0
    with killed_after_step(monkeypatch, 3):
        assert run(tmp_path / "killed") == 130  # the CLI's answer to an interrupt
    assert (tmp_path / "killed" / "checkpoint-2" / "processor_config.json").is_file()
    assert run(tmp_path / "killed", "--resume") == 0
    assert metrics_but_timings(tmp_path / "killed") == metrics_but_timings(tmp_path / "whole")
    assert (tmp_path / "killed" / "final" / "processor_config.json").is_file()


BY_COLOUR = (
    "def by_colour(prompts, first, second, images, **kw):\n"
    "    assert all(len(row) == 1 and row[0].mode == 'RGB' for row in images), images\n"
    "    red = [row[0].getpixel((0, 0))[0] > 128 for row in images]\n"  # red prefers the longer answer, blue the shorter
    "    return [0.5 if len(a) == len(b) else float((len(a) > len(b)) == r) for a, b, r in zip(first, second, red)]\n"
)


def online_dpo_overrides(model, tmp_path, output, **more) -> dict:
    """Online DPO on the colour prompts, judged by the picture's colour (BY_COLOUR), 8 prompts a round."""
    judge = tmp_path / "judge.py"
    judge.write_text(BY_COLOUR)
    return {
        "model.path": str(model),
        "online.online": True,
        "rollout.prompts": str(colour_prompts(tmp_path)),
        "online.judge": f"{judge}:by_colour",
        "online.rounds": 1,
        "online.steps_per_round": 2,
        "online.keep_truncated": True,
        "rollout.prompts_per_step": 8,
        "rollout.max_new_tokens": 6,
        "train.batch_size": 2,
        "train.micro_batch_size": 1,
        "train.output": str(output),
        "train.report_to": ["none"],
        "optim.lr": 1e-3,
        **more,
    }


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_online_dpo_on_each_family_samples_with_the_images_and_trains_on_its_pairs(vlm_dirs, tmp_path, capsys, family):
    import math

    from tether.config import build_config
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig

    overrides = online_dpo_overrides(vlm_dirs[family], tmp_path, tmp_path / "run")
    summary = run_dpo(build_config(DPOConfig, overrides=overrides))
    assert summary["steps"] == 2 and summary["online_rounds"][0]["pairs"] >= 2
    assert "8of8promptsshowimages,giventoeveryforward" in "".join(capsys.readouterr().err.split())  # the plan
    pairs = [json.loads(line) for line in (tmp_path / "run" / "rounds" / "round-0.jsonl").read_text().splitlines()]
    for pair in pairs:  # the judge saw each prompt's own picture: the round's pairs follow its colour
        (image,) = pair["images"]
        assert Path(image).is_absolute() and Path(image).is_file()
        longer = len(pair["chosen"][0]["content"]) > len(pair["rejected"][0]["content"])
        assert longer == image.endswith("red.png"), pair
    first, last = (json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
    # the policy is the reference at the first step (both with the image placeholder hidden and the pair's image in
    # the forward), so the loss is log 2 up to the float32 sums' ulps scaled by β (the offline DPO test's bound)
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert last["train/loss"] != first["train/loss"]


def test_online_dpo_of_a_vlm_samples_its_next_round_beside_the_trainer(vlm_dirs, tmp_path, one_thread):
    """--max-staleness 2 with two steps a round: round 1 is queued with the rollout worker when round 0 starts, its
    requests carrying each prompt's pixels; round 0's pairs and training equal the synchronous run's, round 1 is drawn
    two updates back, the parity probe holds, and the pixel files and weight slots are gone at the end."""
    from safetensors.torch import load_file

    from tether.config import build_config
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig

    more = {"online.rounds": 2, "train.save_every": 2, "train.keep_checkpoints": 2, "rollout.response_seeds": True}
    worker = {"rollout.max_staleness": 2, "rollout.async_threads": 1}
    sync, ahead = tmp_path / "sync", tmp_path / "ahead"
    run_dpo(build_config(DPOConfig, overrides=online_dpo_overrides(vlm_dirs["llava"], tmp_path, sync, **more)))
    run_dpo(
        build_config(DPOConfig, overrides=online_dpo_overrides(vlm_dirs["llava"], tmp_path, ahead, **more, **worker))
    )
    assert (sync / "rounds" / "round-0.jsonl").read_text() == (ahead / "rounds" / "round-0.jsonl").read_text()
    one, other = (load_file(run / "checkpoint-2" / "model.safetensors") for run in (sync, ahead))
    assert all(torch.equal(one[k], other[k]) for k in one)
    metrics = [json.loads(line) for line in (ahead / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("async/staleness_max") for m in metrics] == [0.0, None, 2.0, None]
    assert all(m.get("async/parity_max_diff", 0.0) <= 1e-6 for m in metrics)
    pairs = [json.loads(line) for line in (ahead / "rounds" / "round-1.jsonl").read_text().splitlines()]
    assert pairs and all(len(p["images"]) == 1 for p in pairs)
    assert not list(Path("/dev/shm").glob(f"tether-weights-{os.getpid()}-*"))  # pixel files and slots removed


def colour_steps(folder, n: int) -> list[dict]:
    """Step-labelled solutions about a picture (TRL's stepwise shape with an ``images`` column): the first step names
    a colour, right or wrong by the picture; the second follows from it."""
    (folder / "img").mkdir(exist_ok=True)
    for colour in COLOURS:
        (folder / "img" / f"{colour}.png").write_bytes(png(colour))
    names, rows = list(COLOURS), []
    for i in range(n):
        shown, said = names[i % 3], names[(i // 3) % 3]
        rows.append(
            {
                "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]}],
                "completions": [f"I see {said}.", f"So it is {said}."],
                "labels": [said == shown, said == shown],
                "images": [f"img/{shown}.png"],
            }
        )
    return rows


@pytest.mark.parametrize("family", TINY_VISION_FAMILIES)
def test_prm_on_each_family_reads_each_step_after_the_widened_image_and_scores_with_it(vlm_dirs, tmp_path, family):
    from transformers import AutoProcessor

    from tether.config import build_config
    from tether.data.records import read_records
    from tether.data.steps import collate_steps, tokenize_steps
    from tether.models.reward import STEP_HEAD, ProcessRewardScorer, load_reward_model
    from tether.models.vision import VISION_INPUTS
    from tether.rewards.score import process_rows
    from tether.stages.prm import run_prm, step_logits
    from tether.stages.prm_config import PRMConfig

    rows = colour_steps(tmp_path, 12)
    data = write_jsonl(tmp_path / "steps.jsonl", rows)
    tokenizer = load_tokenizer(vlm_dirs[family])
    processor = load_processor(vlm_dirs[family], tokenizer)
    records = read_records(data)
    examples, report = tokenize_steps(records, tokenizer, 512, "\n", processor=processor, label=str(data))
    text_only, _ = tokenize_steps(
        [type(r)({**r.fields, "images": None}, r.where) for r in records[:1]], tokenizer, 512, "\n"
    )  # the text path, no picture: its placeholder is one token
    widened = len(examples[0].input_ids) - len(text_only[0].input_ids)
    assert report.images == 12 and widened > 0
    for example in examples:  # token by token: each step is read at its last character, after the widened picture
        pieces = [tokenizer.decode(example.input_ids[: end + 1]) for end in example.step_ends]
        assert [p.rstrip().endswith(".") and not p.endswith(".\nS") for p in pieces] == [True, True], pieces
        assert "I see" in pieces[0] and "So it is" not in pieces[0] and "So it is" in pieces[1]
    assert examples[0].step_ends == [e + widened for e in text_only[0].step_ends]
    overrides = {
        "model.path": str(vlm_dirs[family]),
        "data.path": str(data),
        "data.eval_fraction": 0.25,
        "train.output": str(tmp_path / "prm"),
        "train.max_steps": 2,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "train.eval_every": 2,
        "train.report_to": ["none"],
        "optim.lr": 1e-3,
    }
    summary = run_prm(build_config(PRMConfig, overrides=overrides))
    assert summary["steps"] == 2 and 0 <= summary["eval/step_accuracy"] <= 1
    final = tmp_path / "prm" / "final"
    model = load_reward_model(final, tokenizer, [STEP_HEAD]).eval()
    batch = collate_steps(examples[:2], tokenizer.pad_token_id)
    other = collate_steps([examples[1], examples[0]], tokenizer.pad_token_id)  # examples 0, 1: red and green
    swapped = {**batch, **{k: other[k] for k in VISION_INPUTS if k in other}}
    with torch.no_grad():
        own, moved = step_logits(model, batch), step_logits(model, swapped)
    assert own.shape == (2, 2) and not torch.equal(own, moved)  # the pixels reach the step scores
    assert hasattr(AutoProcessor.from_pretrained(final), "image_processor")  # final/ holds the processor
    # as --process-reward-model of a vision-language policy: the sampled prompt's text and the response, steps read
    # where training read them, with the prompt row's image — the same probabilities as the training forward's
    rows = prompt_rows(data, images=PIXELS)
    prompts = ImagePrompts(tokenizer, processor, rows, str(data), PIXELS)
    texts, ends = [], []
    for i in range(2):
        first, second = rows[i]["completions"]
        texts.append(prompts.texts[i] + f"{first}\n{second}\n")
        base = len(prompts.texts[i])
        ends.append([base + len(first), base + len(first) + 1 + len(second)])
    online = process_rows(ProcessRewardScorer(final), texts, ends, rows[:2])
    # one forward each way over the same tokens and pixels (padded rows of the same width): float32 sums in another
    # batch shape may differ by a few ulps of logits of size ~1, far inside 1e-5 after the sigmoid
    assert torch.tensor(online) == pytest.approx(torch.sigmoid(own), abs=1e-5)


def test_grpo_takes_a_vision_language_process_reward_model_and_refuses_a_text_one(
    vlm_dirs, llama_dir, tmp_path, rules, capsys
):
    from tether.config import build_config
    from tether.stages.prm import run_prm
    from tether.stages.prm_config import PRMConfig

    data = write_jsonl(tmp_path / "steps.jsonl", colour_steps(tmp_path, 8))
    prm = {"model.path": str(vlm_dirs["llava"]), "data.path": str(data), "train.output": str(tmp_path / "prm")}
    run_prm(build_config(PRMConfig, overrides={**prm, "train.max_steps": 1, "train.report_to": ["none"]}))
    # one step per response, ending at its last character: the process reward model scores it with the prompt's image
    steps = ["--process-reward-model", str(tmp_path / "prm" / "final"), "--step-pattern", "(?s).$"]
    args = grpo_args(vlm_dirs["llava"], colour_prompts(tmp_path), rules, tmp_path / "run", *steps)
    assert main(args) == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < m["reward/process_reward_model/mean"] < 1 for m in metrics)  # one step's probability each
    plain = [
        {**{k: v for k, v in r.items() if k != "images"}, "prompt": "Which colour?"} for r in colour_steps(tmp_path, 8)
    ]
    text_prm = {**prm, "model.path": str(llama_dir), "data.path": str(write_jsonl(tmp_path / "plain.jsonl", plain))}
    text_prm["train.output"] = str(tmp_path / "text-prm")
    run_prm(build_config(PRMConfig, overrides={**text_prm, "train.max_steps": 1, "train.report_to": ["none"]}))
    text = grpo_args(vlm_dirs["llava"], colour_prompts(tmp_path), rules, tmp_path / "text", "--process-reward-model")
    assert main([*text, str(tmp_path / "text-prm" / "final")]) == 2
    assert "Not built yet: a text --process-reward-model" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "text").exists()
