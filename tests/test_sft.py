"""The SFT stage end to end on tiny models: learning, resume, accumulation equivalence, LoRA, run-folder rules."""

import json

import pytest
import torch
import yaml
from conftest import kill_before_final, killed_after_step, write_jsonl
from transformers import AutoModelForCausalLM, AutoTokenizer

from tether.config import ConfigError, build_config
from tether.data.records import DataError, read_records, split_records
from tether.rollout.texts import generate_texts
from tether.stages.sft import SFTConfig, SFTObjective, run_sft


def sft_config(model_dir, files, output, **train):
    train_path, eval_path = files
    overrides = {
        "model.path": str(model_dir),
        "data.path": str(train_path),
        "data.eval_path": str(eval_path),
        "data.max_length": 64,
        "optim.lr": 3e-3,
        "optim.warmup_ratio": 0.1,
        "train.output": str(output),
        "train.batch_size": 8,
        "train.micro_batch_size": 4,
        "train.max_steps": 6,
        "train.eval_every": 3,
        "train.save_every": 0,
        "train.report_to": ["none"],
    }
    for key, value in train.items():
        overrides[key.replace("__", ".")] = value
    return build_config(SFTConfig, overrides=overrides)


def read_metrics(output):
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sft_lowers_held_out_loss_and_final_loads_and_generates(llama_dir, addition_files, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = sft_config(
        llama_dir,
        addition_files,
        out,
        train__max_steps=40,
        train__eval_every=20,
        train__batch_size=16,
        train__micro_batch_size=8,
        optim__lr=5e-3,
    )
    run_sft(cfg)
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, 41))
    evals = [m["eval/loss"] for m in metrics if "eval/loss" in m]
    assert len(evals) == 2
    first_train = metrics[0]["train/loss"]
    assert evals[-1] < 0.6 * first_train, (first_train, evals)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval/loss"] == evals[-1] and summary["eval/ppl"] == pytest.approx(
        2.718281828 ** evals[-1], rel=1e-6
    )
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tokenizer = AutoTokenizer.from_pretrained(out / "final")
    (text,) = generate_texts(model, tokenizer, ["What is 3 + 4?\n"], max_new_tokens=12)
    assert len(text) > 0
    saved = (out / "config.yaml").read_text()
    assert "plan:" in saved and "micro-batch" in saved
    lines = capsys.readouterr().err.splitlines()  # what loads before the plan; the run's closing line
    assert f"loading the model to train from {llama_dir} …" in lines[: lines.index("tether sft")]
    assert lines[-1] == f"final model: {out / 'final'}  eval/loss {evals[-1]:.4g}  eval/ppl {summary['eval/ppl']:.4g}"


def test_resume_continues_exactly_like_an_uninterrupted_run(llama_dir, addition_files, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    run_sft(sft_config(llama_dir, addition_files, whole, train__save_every=2))
    reference = read_metrics(whole)

    killed = tmp_path / "killed"
    # step 5 reaches metrics.jsonl, but checkpoint-4 is the last checkpoint
    with killed_after_step(monkeypatch, 5), pytest.raises(KeyboardInterrupt):
        run_sft(sft_config(llama_dir, addition_files, killed, train__save_every=2))
    assert (killed / "checkpoint-4").is_dir() and not (killed / "final").exists()
    (killed / ".checkpoint-6.partial").mkdir()  # a write interrupted mid-way must be ignored
    with (killed / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "train/lo')  # and so must a metrics line cut short by the kill

    summary = run_sft(sft_config(llama_dir, addition_files, killed, train__save_every=2, train__resume=True))
    assert summary["resumed_from"] == 4
    resumed = read_metrics(killed)
    assert [m["step"] for m in resumed] == list(range(1, 7))  # the killed run's step 5 was replaced, not duplicated
    for a, b in zip(reference, resumed):
        for key in ("train/loss", "train/lr", "train/grad_norm", "train/tokens"):
            assert a[key] == b[key], (a["step"], key)
        assert a.get("eval/loss") == b.get("eval/loss")
    a = AutoModelForCausalLM.from_pretrained(whole / "final").state_dict()
    b = AutoModelForCausalLM.from_pretrained(killed / "final").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_zero_steps_missing_checkpoints_and_changed_settings(llama_dir, addition_files, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="no complete, readable checkpoint"):
        run_sft(sft_config(llama_dir, addition_files, out, train__resume=True))
    run_sft(sft_config(llama_dir, addition_files, out, train__save_every=3))
    with pytest.raises(ConfigError, match="already at step 6 .* nothing left to train"):
        run_sft(sft_config(llama_dir, addition_files, out, train__save_every=3, train__resume=True))
    with pytest.raises(ConfigError, match="optim.lr"):
        run_sft(sft_config(llama_dir, addition_files, out, train__resume=True, optim__lr=1e-2, train__max_steps=9))
    with pytest.raises(ConfigError, match="already holds a run; pass --resume .* or --overwrite"):
        run_sft(sft_config(llama_dir, addition_files, out))
    summary = run_sft(
        sft_config(llama_dir, addition_files, out, train__save_every=3, train__resume=True, train__max_steps=9)
    )
    assert summary["resumed_from"] == 6 and read_metrics(out)[-1]["step"] == 9


def test_gradient_accumulation_1x4_equals_4x1_and_naive_averaging_would_not(llama_dir, addition_files, tmp_path):
    """The CLI end to end: the same loss and gradient norm at every step, 1 micro-batch of 4 or 4 of 1.

    Weights are compared in float64 below, not here: fp32 sums in another order differ in the last bits, and AdamW
    divides a near-zero gradient by its own running scale (update ≈ lr·g/(|g| + ε)), so a rounding difference in
    such a gradient moves that weight by up to ~lr: how far depends on the CPU's kernels, not on tether. The loss
    and the gradient norm are sums over the whole step (≤ 4·64 tokens), dominated by the large gradients, and move
    by ~√N·u ≈ 1e-6 relative (u = 6e-8, fp32): rel 1e-5 for the loss, 1e-4 for the norm (a square root of a sum
    of squares of ~10⁴ parameters' gradients) hold on any x86-64 CPU."""
    one = tmp_path / "micro4"
    four = tmp_path / "micro1"
    run_sft(sft_config(llama_dir, addition_files, one, train__batch_size=4, train__micro_batch_size=4))
    run_sft(sft_config(llama_dir, addition_files, four, train__batch_size=4, train__micro_batch_size=1))
    metrics_one, metrics_four = read_metrics(one), read_metrics(four)
    assert [m["step"] for m in metrics_one] == [m["step"] for m in metrics_four] and len(metrics_one) >= 6
    for a, b in zip(metrics_one, metrics_four):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5, abs=1e-6)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)


def _step_in_float64(model_dir, tokenizer, examples, micro_batch_size: int, steps: int, optimizer: str):
    """``steps`` optimizer steps of SFT through the loop's own train_step, on a float64 copy of the model: (the
    gradient of the first step, the weights after the last)."""
    from tether.data.sft import collate
    from tether.models.lm import load_model
    from tether.sections import OptimSection
    from tether.train.offline import split_micro_batches, train_step
    from tether.train.run import make_accelerator
    from tether.train.schedule import build_optimizer

    torch.manual_seed(0)
    model = load_model(model_dir).double()
    params = [q for q in model.parameters() if q.requires_grad]
    if optimizer == "adamw":  # the run's optimizer and schedule, as build_optimizer makes them
        opt, scheduler = build_optimizer(params, OptimSection(lr=3e-3, warmup_ratio=0.1), steps)
    else:
        opt = torch.optim.SGD(params, lr=3e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    first_grad = {}

    def keep_the_first_gradient(optimizer, args, kwargs):
        if not first_grad:
            first_grad.update({n: q.grad.detach().clone() for n, q in model.named_parameters() if q.grad is not None})

    opt.register_step_pre_hook(keep_the_first_gradient)
    accelerator = make_accelerator("cpu")
    for k in range(steps):
        batch = examples[4 * k : 4 * k + 4]
        micro = [collate(part, tokenizer.pad_token_id) for part in split_micro_batches(batch, micro_batch_size)]
        train_step(accelerator, model, opt, scheduler, micro, SFTObjective(), params, max_grad_norm=1.0)
    return first_grad, {n: q.detach().clone() for n, q in model.named_parameters()}


def test_accumulated_gradient_and_adamw_weights_of_1x4_and_4x1_agree_in_float64(llama_dir, tokenizer, addition_files):
    """What accumulation claims, checked where rounding cannot decide it: in float64 (u = 1.1e-16) a gradient entry
    summed over N ≤ 4·64 per-token terms in another order moves by at most N·u·Σ|terms| ≈ 3e-14 of its scale, and
    AdamW's sensitivity to such a change is at most lr·ε·δ/(|g| + ε)² ≤ lr·δ/(4ε) ≈ 2e-10 after 6 steps — so
    atol 1e-9 on the weights and 1e-10·max|g| on the gradient hold whatever the CPU's kernels or thread count."""
    from tether.data.records import read_records
    from tether.data.sft import tokenize_records

    examples, _ = tokenize_records(read_records(addition_files[0])[:24], tokenizer, 64)
    for optimizer in ("adamw", "sgd"):
        grad_a, weights_a = _step_in_float64(llama_dir, tokenizer, examples, 4, 6, optimizer)
        grad_b, weights_b = _step_in_float64(llama_dir, tokenizer, examples, 1, 6, optimizer)
        scale = max(float(g.abs().max()) for g in grad_a.values())
        for name in grad_a:
            torch.testing.assert_close(grad_a[name], grad_b[name], atol=1e-10 * scale, rtol=0)
        for name in weights_a:
            torch.testing.assert_close(weights_a[name], weights_b[name], atol=1e-9, rtol=0)
        assert any(not torch.equal(weights_a[n], load) for n, load in _initial(llama_dir).items())  # it trained


def _initial(model_dir) -> dict:
    from tether.models.lm import load_model

    return {n: q.detach().double() for n, q in load_model(model_dir).named_parameters()}


def test_the_loss_is_normalised_by_the_step_token_count(llama_dir, tokenizer):
    """Micro-batches of unequal length: Σ nll / N_step differs from the mean of per-micro-batch means."""
    from tether.data.sft import Example, collate
    from tether.models.lm import load_model

    model = load_model(llama_dir)
    short = collate([Example([5, 6, 7], [0, 1, 1], "s")], tokenizer.pad_token_id)
    long = collate([Example(list(range(5, 25)), [0] + [1] * 19, "l")], tokenizer.pad_token_id)
    objective = SFTObjective()
    sums = [objective.loss_sum(model, b)[0].item() for b in (short, long)]
    counts = [objective.count(b) for b in (short, long)]
    assert counts == [2, 19]
    both = collate(
        [Example([5, 6, 7], [0, 1, 1], "s"), Example(list(range(5, 25)), [0] + [1] * 19, "l")], tokenizer.pad_token_id
    )
    joint = objective.loss_sum(model, both)[0].item() / objective.count(both)
    assert joint == pytest.approx(sum(sums) / sum(counts), rel=1e-5)
    assert abs(joint - (sums[0] / counts[0] + sums[1] / counts[1]) / 2) > 1e-3  # the naive mean differs


@pytest.mark.parametrize("packing", [True, False])
def test_lora_and_packing_runs_resume_and_save_a_merged_model(llama_dir, addition_files, tmp_path, packing):
    out = tmp_path / "lora"
    base = dict(model__lora_r=4, model__lora_alpha=8.0, data__packing=packing, train__save_every=3)
    run_sft(sft_config(llama_dir, addition_files, out, **base, train__max_steps=3))
    assert (out / "checkpoint-3" / "adapter_config.json").is_file()
    run_sft(sft_config(llama_dir, addition_files, out, **base, train__max_steps=6, train__resume=True))
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, 7))
    merged = AutoModelForCausalLM.from_pretrained(out / "final")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    base_model = AutoModelForCausalLM.from_pretrained(llama_dir)
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, base_model.state_dict()[n])]
    assert changed  # the adapters were merged into the weights


def test_a_kill_between_the_last_checkpoint_and_final_resumes_to_the_same_model(
    llama_dir, addition_files, tmp_path, monkeypatch
):
    from tether.stages import sft as sft_module

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_sft(sft_config(llama_dir, addition_files, whole, train__save_every=3))
    kill_before_final(monkeypatch, sft_module)
    with pytest.raises(KeyboardInterrupt):
        run_sft(sft_config(llama_dir, addition_files, killed, train__save_every=3))
    monkeypatch.undo()
    assert (killed / "checkpoint-6").is_dir() and not (killed / "final").exists()
    summary = run_sft(sft_config(llama_dir, addition_files, killed, train__save_every=3, train__resume=True))
    assert summary["resumed_from"] == 6 and [m["step"] for m in read_metrics(killed)] == list(range(1, 7))
    a = AutoModelForCausalLM.from_pretrained(whole / "final").state_dict()
    b = AutoModelForCausalLM.from_pretrained(killed / "final").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_moved_run_folder_resumes_and_an_output_that_is_a_file_is_refused(llama_dir, addition_files, tmp_path):
    import shutil

    run_sft(sft_config(llama_dir, addition_files, tmp_path / "run", train__save_every=3, train__max_steps=3))
    shutil.move(tmp_path / "run", tmp_path / "moved")
    summary = run_sft(
        sft_config(llama_dir, addition_files, tmp_path / "moved", train__save_every=3, train__resume=True)
    )
    assert summary["resumed_from"] == 3 and read_metrics(tmp_path / "moved")[-1]["step"] == 6
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ConfigError, match="a-file is a file"):
        run_sft(sft_config(llama_dir, addition_files, tmp_path / "a-file"))


def test_resume_passes_over_a_damaged_newest_checkpoint(llama_dir, addition_files, tmp_path, monkeypatch):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_sft(sft_config(llama_dir, addition_files, whole, train__save_every=2))
    with killed_after_step(monkeypatch, 5), pytest.raises(KeyboardInterrupt):
        run_sft(sft_config(llama_dir, addition_files, killed, train__save_every=2))
    monkeypatch.undo()
    weights = killed / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: len(weights.read_bytes()) // 2])  # checkpoint-4 cut short on disk
    summary = run_sft(sft_config(llama_dir, addition_files, killed, train__save_every=2, train__resume=True))
    assert summary["resumed_from"] == 2
    assert [m["train/loss"] for m in read_metrics(killed)] == [m["train/loss"] for m in read_metrics(whole)]
    for folder in killed.glob("checkpoint-*"):
        (folder / "trainer_state.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"no complete, readable checkpoint.*trainer_state.json"):
        run_sft(sft_config(llama_dir, addition_files, killed, train__save_every=2, train__resume=True))


def test_overwrite_touches_nothing_before_the_data_is_checked_nor_a_folder_tether_did_not_write(llama_dir, tmp_path):
    out = tmp_path / "mine"
    (out / "final").mkdir(parents=True)
    (out / "config.yaml").write_text("my: settings\n")
    (out / "final" / "README.md").write_text("my notes")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "no format tether reads"}])
    with pytest.raises(DataError, match="bad.jsonl:1: no field this data format needs"):
        run_sft(sft_config(llama_dir, (bad, bad), out, train__overwrite=True))
    assert (out / "config.yaml").read_text() == "my: settings\n" and (out / "final" / "README.md").is_file()
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "1 + 1 =", "completion": " 2"}] * 16)
    with pytest.raises(ConfigError, match="config.yaml was not written by tether"):
        run_sft(sft_config(llama_dir, (good, good), out, train__overwrite=True))
    assert (out / "final" / "README.md").is_file()


def test_a_run_written_before_an_option_existed_resumes_while_the_option_keeps_its_default(
    llama_dir, addition_files, tmp_path
):
    import shutil

    import yaml

    from tether.config import ConfigError

    out = tmp_path / "run"
    run_sft(sft_config(llama_dir, addition_files, out, train__max_steps=4, train__save_every=2))
    saved = yaml.safe_load((out / "config.yaml").read_text())
    for key in ("mixed_precision", "fsdp", "frozen_dtype", "gradient_checkpointing"):  # as an older tether wrote it
        del saved["model"][key]
    (out / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / "final")
    resume = dict(train__max_steps=4, train__save_every=2, train__resume=True)
    with pytest.raises(ConfigError, match=r"model.mixed_precision: 'no' -> 'bf16'"):
        run_sft(sft_config(llama_dir, addition_files, out, **resume, model__mixed_precision="bf16"))
    summary = run_sft(sft_config(llama_dir, addition_files, out, **resume, model__gradient_checkpointing=True))
    # gradient checkpointing changes memory only: allowed
    assert summary["resumed_from"] == 2


def test_wandb_takes_its_own_variables_and_mlflow_gets_the_settings(tmp_path, monkeypatch):
    """The trackers as their users configure them: WANDB_PROJECT / WANDB_NAME; mlflow receives the resolved settings
    as parameters (stand-in modules record the calls: neither tracker is installed here)."""
    import sys
    import types

    calls = {}
    wandb = types.SimpleNamespace(init=lambda **kw: calls.setdefault("wandb", kw) and None)
    mlflow = types.SimpleNamespace(
        start_run=lambda **kw: calls.setdefault("run", kw),
        log_params=lambda params: calls.setdefault("params", params),
        log_metrics=lambda *a, **k: None,
        end_run=lambda: None,
    )
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    monkeypatch.setenv("WANDB_PROJECT", "my-project")
    monkeypatch.setenv("WANDB_NAME", "try-3")
    from tether.train.logger import MetricsLogger

    logger = MetricsLogger(
        tmp_path, ["wandb", "mlflow"], {"model": {"path": "m"}, "optim": {"lr": 1e-5}}, 0, 2, run_name="sft"
    )
    logger.close()
    assert calls["wandb"]["project"] == "my-project" and calls["wandb"]["name"] == "try-3"
    assert calls["params"] == {"model.path": "m", "optim.lr": "1e-05"} and calls["run"] == {"run_name": "sft"}


def test_bad_rows_are_named_before_the_held_out_split_whichever_side_they_fall_on(llama_dir, tmp_path):
    """A one-row file's bad row is named (not 'leaves no training records'), and the first bad row of the file is
    named even when the seeded split holds it out."""
    one = write_jsonl(tmp_path / "one.jsonl", [{"messages": "hello"}])
    config = sft_config(llama_dir, (one, one), tmp_path / "out", data__eval_path="", data__eval_fraction=0.05)
    with pytest.raises(DataError, match=r"one.jsonl:1: field 'messages' must be a non-empty list"):
        run_sft(config)
    prefs = [{"prompt": f"Q{i} ", "chosen": "yes", "rejected": "no"} for i in range(20)]  # not SFT data
    path = write_jsonl(tmp_path / "prefs.jsonl", prefs)
    for seed in range(40):  # a seed whose held-out share holds row 1
        held = split_records(read_records(path), 0.05, seed)[1]
        if held[0].where.endswith(":1"):
            break
    config = sft_config(llama_dir, (path, path), tmp_path / "out", data__eval_path="", train__seed=seed)
    with pytest.raises(DataError, match=r"prefs.jsonl:1: no field this data format needs"):
        run_sft(config)
    assert not (tmp_path / "out").exists()  # checked before the run folder is touched


def test_the_chunked_head_trains_as_the_whole_head_and_is_refused_where_it_would_be_wrong(
    llama_dir, addition_files, tmp_path, tokenizer
):
    """--chunked-head end to end: the same loss and gradient norm at every step as the whole head (fp32 sums in
    another order: the bounds of the accumulation test above). Refused by the stages without an LM-head objective,
    with --fsdp, and by its start-up check for a head it would apply wrongly (a soft cap after it, an adapter on it)."""
    from tether.models.checks import check_chunked_head
    from tether.models.lm import load_model
    from tether.stages.rm_config import RMConfig

    whole, chunked = tmp_path / "whole", tmp_path / "chunked"
    run_sft(sft_config(llama_dir, addition_files, whole, train__batch_size=4, train__micro_batch_size=2))
    run_sft(
        sft_config(
            llama_dir, addition_files, chunked, train__batch_size=4, train__micro_batch_size=2, model__chunked_head=True
        )
    )
    for a, b in zip(read_metrics(whole), read_metrics(chunked), strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5, abs=1e-6)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    plan = yaml.safe_load((chunked / "config.yaml").read_text())["plan"]
    assert "a chunk of positions at a time, recomputed in the backward" in plan["LM head"]

    with pytest.raises(ConfigError, match="tether rm does not take it"):
        build_config(
            RMConfig, overrides={"model.path": "m", "data.path": "d", "train.output": "o", "model.chunked_head": True}
        )
    with pytest.raises(ConfigError, match="chunked_head with fsdp"):
        sft_config(llama_dir, addition_files, tmp_path / "x", model__chunked_head=True, model__fsdp=True)
    model = load_model(llama_dir, tokenizer)
    check_chunked_head(model, "plain")  # passes
    with pytest.raises(ConfigError, match="pictures: --chunked-head is not built for a vision-language model"):
        check_chunked_head(model, "pictures", vision=True)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match="capped: this model transforms its logits after the LM head"):
        check_chunked_head(model, "capped")
    model.config.final_logit_softcapping = None
    model.lm_head = torch.nn.Sequential(model.lm_head)  # what the check sees of an adapter's or a quantiser's wrapper
    with pytest.raises(
        ConfigError, match="wrapped: --chunked-head applies a plain linear head itself; this model has a "
    ):
        check_chunked_head(model, "wrapped")


@pytest.mark.parametrize("chat_first", [False, True])
def test_string_and_chat_rows_of_one_file_each_get_one_bos(tmp_path, chat_first):
    """A prompt/completion file may mix string rows (the tokenizer's post-processor adds BOS) and chat rows (the
    template writes BOS): tokenised in one chunk, each kind is encoded with its own add_special_tokens, so every
    example starts with exactly one BOS, whichever row comes first."""
    from conftest import CORPUS
    from tokenizers import processors

    from tether.data.sft import tokenize_records
    from tether.lab.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=320)
    bos = tokenizer.bos_token
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)]
    )
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    string_row = {"prompt": "1 + 1 = ", "completion": "2"}
    chat_row = {"prompt": [{"role": "user", "content": "1 + 1"}], "completion": [{"role": "assistant", "content": "2"}]}
    rows = [chat_row, string_row] if chat_first else [string_row, chat_row]
    examples, _ = tokenize_records(read_records(write_jsonl(tmp_path / "mixed.jsonl", rows)), tokenizer, 128)
    assert [e.input_ids[:2].count(tokenizer.bos_token_id) for e in examples] == [1, 1]
    assert all(e.input_ids[0] == tokenizer.bos_token_id for e in examples)
