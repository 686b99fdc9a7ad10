"""The vLLM backend with a vision-language policy, on the real engine (vLLM's CPU build): Idefics3, which vLLM's CPU
build serves, samples greedy tokens equal to the HF backend's with each prompt's image (before and after a weight
push), its sampler log-probs are the trainer's, and GRPO runs on it; LLaVA, whose vLLM model code imports
torchvision (left out by the CPU set-up), is refused at the engine's start with that reason.

The engine starts once per model shape (tens of seconds); the tests share it."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from test_multimodal_rl import colour_prompts, grpo_args
from test_vllm import sampling

from tether.cli import main
from tether.data.prompts import prompt_rows
from tether.models.lm import load_tokenizer
from tether.models.vision import build_tiny_vlm, load_processor, never_sample_placeholders
from tether.rollout.backends import HFGenerate, VLLMBackend
from tether.rollout.forward import response_logprobs
from tether.rollout.prompts import stop_token_ids
from tether.train.sampling import ImagePrompts

LOG = Path(tempfile.gettempdir()) / f"tether-vllm-{os.getpid()}.log"


@pytest.fixture(scope="module")
def idefics3(tmp_path_factory, tokenizer):
    """A tiny Idefics3 vLLM's CPU attention accepts (head_dim 32: width 64, 2 heads, in the tower too)."""
    return build_tiny_vlm("idefics3", tokenizer, tmp_path_factory.mktemp("vllm-vlm") / "idefics3", 0, 64, 2, 2)


def policy_and_prompts(folder, tmp_path):
    from transformers import AutoModelForImageTextToText

    tokenizer = load_tokenizer(folder)
    processor = load_processor(folder, tokenizer)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    never_sample_placeholders(model)  # as the online stages set it up
    path = colour_prompts(tmp_path, 4)
    prompts = ImagePrompts(tokenizer, processor, prompt_rows(path, images=2**62), str(path), 2**62)
    encoded = [(*prompts.encode_with_images(i), prompts.texts[i]) for i in range(4)]
    return model, tokenizer, processor, encoded


def test_idefics3_on_vllm_samples_what_hf_does_with_each_image_before_and_after_a_push(idefics3, tmp_path):
    model, tokenizer, processor, encoded = policy_and_prompts(idefics3, tmp_path)
    ids, vision, images, texts = ([e[k] for e in encoded] for k in range(4))
    s = sampling(max_new_tokens=8)
    engine = VLLMBackend(model, tokenizer, s, processor=processor)
    stops = stop_token_ids(tokenizer, model)

    def same_greedy():
        a = engine.generate_ids(ids, s, stops, greedy=True, vision=vision, images=images, texts=texts)
        b = HFGenerate(model, tokenizer).generate_ids(ids, s, stops, greedy=True, vision=vision)
        assert torch.equal(a.response_ids, b.response_ids), (a.response_ids, b.response_ids)
        assert a.vision is not None and len(a.vision) == 4  # the trainer's forwards get the processor's pixels
        return a

    before = same_greedy()
    # the image decides: red and blue prompts alternate, and greedy differs between them on this random model
    assert not torch.equal(before.response_ids[0], before.response_ids[1])
    # sampled at τ = 0.7: the engine's log-prob of each token it drew against the trainer's forward with the pixels;
    # float32 log-softmaxes of logits that differ by summation order only (test_vllm.py's bound: 1e-3), the
    # placeholder's -100 bias leaving it e^-100 of its probability, below float32's resolution of the others'
    s7 = sampling(max_new_tokens=8, temperature=0.7)
    rollout = engine.generate_ids(
        ids * 4, s7, stops, seeds=list(range(16)), vision=vision * 4, images=images * 4, texts=texts * 4
    )
    mask = rollout.response_mask.bool()
    trainer = response_logprobs(model, rollout, 0.7)
    assert mask.sum() > 40 and (trainer - rollout.sampler_logprobs)[mask].abs().max() < 1e-3
    with torch.no_grad():  # new weights everywhere, the vision tower's too: the push carries the VLM's names
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.weights_updated(model)
    after = same_greedy()
    assert not torch.equal(before.response_ids, after.response_ids)
    assert "images processed by the engine" in engine.describe()
    with pytest.raises(ValueError, match="takes each context's images and text"):
        engine.generate_ids(ids, s, stops, greedy=True, vision=vision)


@pytest.fixture
def rules_file(tmp_path):
    rules = tmp_path / "rules.py"
    rules.write_text(
        "def redness(completions, images, **kw):\n"
        "    return [row[0].getpixel((0, 0))[0] / 255 + len(c) / 100 for c, row in zip(completions, images)]\n"
    )
    return rules


def test_grpo_on_vllm_with_a_vision_language_policy_in_the_trainer_and_beside_it(
    idefics3, tmp_path, rules_file, capsys
):
    """GRPO on the engine in the trainer's process, then (--max-staleness 1) on an engine in the rollout worker, which
    is sent each request's pixels and images in a file (rollout/worker_wire.py): its first step's responses (response
    seeds) are the synchronous engine's, its next one update behind, the parity probe of its engine holds."""
    more = ["--rollout-backend", "vllm", "--vllm-kv-cache-gib", "0.0625", "--response-seeds", "--sample-every", "1"]
    prompts = colour_prompts(tmp_path)
    assert main(grpo_args(idefics3, prompts, rules_file, tmp_path / "run", *more)) == 0, capsys.readouterr().err
    err = "".join(capsys.readouterr().err.split())
    assert "imagesprocessedbytheengine" in err and "8of8promptsshowimages" in err
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # the sampler gap is measured on every step: the engine's log-probs against the trainer's, pixels included
    assert all(m["rollout/sampler_logprob_diff_max"] < 1e-3 for m in metrics)
    assert metrics[-1]["eval/reward/redness"] == pytest.approx((220 + 20) / 2 / 255, abs=0.2)

    worker = ["--max-staleness", "1", "--async-threads", str(torch.get_num_threads())]
    args = grpo_args(idefics3, prompts, rules_file, tmp_path / "ahead", *more, *worker)
    assert main(args) == 0, capsys.readouterr().err
    first = [
        [
            json.loads(line)["response"]
            for line in (tmp_path / d / "samples.jsonl").open()
            if json.loads(line)["step"] == 1
        ]
        for d in ("run", "ahead")
    ]
    assert first[0] == first[1] and len(first[0]) == 4
    ahead = [json.loads(line) for line in (tmp_path / "ahead" / "metrics.jsonl").read_text().splitlines()]
    assert [m["async/staleness_max"] for m in ahead] == [0.0, 1.0]
    assert all(
        0 <= m["async/parity_max_diff"] < 1e-3 and m["rollout/sampler_logprob_diff_max"] < 1e-3 for m in ahead[:1]
    )


def test_llava_on_vllm_is_refused_at_the_start_naming_torchvision(vlm_dirs, tmp_path, rules_file):
    """Run as a user runs it (a process of its own: pytest's log capture would hold vLLM's registry error)."""
    pytest.importorskip("vllm")
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: vLLM's LLaVA would start")
    args = grpo_args(
        vlm_dirs["llava"], colour_prompts(tmp_path), rules_file, tmp_path / "run", "--rollout-backend", "vllm"
    )
    done = subprocess.run([sys.executable, "-m", "tether", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert "the vLLM engine did not start" in said and "No module named 'torchvision'" in said, said[-2000:]
    assert "imports torchvision, which the CPU set-up leaves out" in said
