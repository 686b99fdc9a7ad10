"""What both DPO paths share (offline and online rounds): the data read and checked before the run folder is
touched, the model, the reference log-probs (tether/stages/dpo_reference.py) and the optimizer loaded once
(``setup_dpo``), the plan, held-out evaluation, one optimizer step on the offline loop's batching, the summary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tether.config import ConfigError
from tether.data.dpo import collate_policy_preferences, tokenize_policy_preferences, tokenize_unpaired
from tether.data.multimodal import refuse_images, text_only
from tether.data.records import read_records, tokenize_split
from tether.models.checks import check_chunked_head, check_position_restarts, check_prompt_sharing
from tether.models.lm import length_limit, load_stage_tokenizer, load_trainable_model, parameter_summary
from tether.models.packing import describe, describe_head, prompt_sharing
from tether.models.vision import is_vision_language, load_processor, never_sample_placeholders
from tether.rollout.backends import BACKENDS
from tether.stages.dpo_config import DPOConfig
from tether.stages.dpo_objective import DPOObjective
from tether.stages.dpo_reference import ReferenceLogps
from tether.train.offline import EpochOrder, loop_settings, step_micro_batches, train_step
from tether.train.offline_run import plan_steps, prepare_trained, read_eval_records
from tether.train.online_setup import online_sharded
from tether.train.run import check_steps_left
from tether.train.sharding import is_sharded, sampling_copy_of


@dataclass
class DPOSetup:
    """What both DPO paths load: run folder, tokenizer, data, model, reference, optimizer."""

    accelerator: object
    config: dict
    out: Path
    start_step: int
    checkpoint: Path | None
    tokenizer: object
    train: list
    evals: list
    reports: list
    model: object
    unwrapped: object
    objective: DPOObjective
    reference: ReferenceLogps | None
    reference_source: str
    optimizer: object
    scheduler: object
    total_steps: int
    state: dict
    sampling_copy: object = None  # online --fsdp: an ordinary copy of the sharded policy, which samples the pairs
    processor: object = None  # a vision-language model's: saved with the weights in checkpoints and final/
    share_prompt: bool = False  # micro-batches in the shared-prompt layout (shared_prompt_layout)
    rows_note: str = ""  # the plan's words for that choice


def load_examples(cfg: DPOConfig, tokenizer, processor=None):
    """Training and held-out examples; online runs may have held-out pairs only (--eval-data without --data). With a
    vision-language model's ``processor``, pairs and ranked lists show each record's images in the prompt."""
    d = cfg.data
    eval_records = read_eval_records(d)
    limit = length_limit(d.max_length, cfg.model.path)

    def tokenize(recs, label):
        if processor is None:
            refuse_images(recs, text_only(cfg.model.path))
        if cfg.dpo.loss == "kto":  # each row's answer, and the next row's, under this row's prompt and images
            return tokenize_unpaired(recs, tokenizer, limit, d.strict, label, processor, cfg.model.max_image_pixels)
        return tokenize_policy_preferences(
            recs, tokenizer, limit, d.strict, label, processor, cfg.model.max_image_pixels
        )

    if d.path:
        _, _, train, evals, reports = tokenize_split(
            read_records(d.path, d.columns, d.split, d.max_records),
            eval_records,
            d.eval_fraction,
            cfg.train.seed,
            d.path,
            tokenize,
            d.eval_path,
            (lambda rec: rec.fields.get("label")) if cfg.dpo.loss == "kto" else None,  # both labels on each side
        )
    else:  # online, held-out pairs only
        train, (evals, report) = [], tokenize(eval_records, d.eval_path)
        reports = [report]
    longest = max((len(e.responses) for e in train + evals), default=2)
    if longest > 2 and cfg.dpo.loss != "listwise":
        raise ConfigError(
            f"{d.path} holds ranked lists of up to {longest} responses; loss {cfg.dpo.loss} compares "
            "pairs — use --loss listwise (Plackett–Luce), or pairs data"
        )
    return train, evals, reports


def shared_prompt_layout(cfg: DPOConfig, model, processor) -> tuple[bool, str]:
    """Whether the micro-batches lay each example's responses after one copy of their prompt (--share-prompt), and
    the plan's words for it: padding-free text rows only, not KTO's blocks, not under dropout (the layout is exact
    for a deterministic forward), a model whose attention reads the layout's 4-D mask
    (packing.prompt_sharing_refusal)."""
    if processor is not None:
        return False, ""
    if cfg.dpo.loss == "kto" and cfg.model.padding_free and cfg.model.share_prompt:
        return False, "; prompts not shared: KTO forwards its two blocks apart"
    share, note = prompt_sharing(cfg.model, model)
    if share:
        check_prompt_sharing(model, cfg.model.path)
    return share, note


def load_dpo_data(cfg: DPOConfig):
    """(tokenizer, train, held-out, reports, a vision-language model's processor or None), read and checked before
    the run folder is touched."""
    tokenizer = load_stage_tokenizer(cfg.model)
    processor = None
    if is_vision_language(cfg.model.path):  # online: the prompt file's images too (train/sampling.py ImagePrompts)
        processor = load_processor(cfg.model.path, tokenizer, cfg.model.trust_remote_code)
    has_data = cfg.data.path or cfg.data.eval_path
    train, evals, reports = load_examples(cfg, tokenizer, processor) if has_data else ([], [], [])
    return tokenizer, train, evals, reports, processor


def setup_dpo(cfg: DPOConfig, data, accelerator, config: dict, start_step: int, checkpoint: Path | None) -> DPOSetup:
    out = Path(cfg.train.output)
    tokenizer, train, evals, reports, processor = data
    if cfg.online.online:
        total_steps = cfg.total_steps_online
        cfg.train.grad_accum(accelerator.num_processes)
        check_steps_left(start_step, total_steps, checkpoint)
    else:
        total_steps = plan_steps(cfg, accelerator, len(train), start_step, checkpoint)
    model = load_trainable_model(cfg.model, tokenizer, checkpoint).to(accelerator.device)
    if cfg.model.padding_free and processor is None:  # a vision model's rows stay padded (data/dpo.py)
        check_position_restarts(model, cfg.model.path)
    share_prompt, rows_note = shared_prompt_layout(cfg, model, processor)
    if cfg.model.chunked_head:
        check_chunked_head(model, cfg.model.path, processor is not None)
    # online, a vision-language policy samples: its image placeholder is never sampled, in the policy's and the
    # reference's forwards alike (models/vision.py), so the round's log-ratios start at 0
    hide_placeholders = cfg.online.online and processor is not None
    if hide_placeholders:
        never_sample_placeholders(model)
    state = json.loads((checkpoint / "trainer_state.json").read_text()) if checkpoint else {}
    objective = DPOObjective(cfg.dpo, state.get("beta_dpo"), cfg.model.chunked_head)
    reference, source = None, "not used (reference-free loss)"
    if objective.needs_reference:
        reference = ReferenceLogps(
            cfg.model,
            cfg.dpo.reference_cache or str(out / "reference_cache"),
            cfg.dpo.reference_batch_size,
            tokenizer,
            model,
            accelerator.device,
            fresh_policy=checkpoint is None,
            padding_free=cfg.model.padding_free,
            share_prompt=share_prompt,
            hide_placeholders=hide_placeholders,
        )
        source = f"computed each round from {reference.describe()}"
        used = visited_examples(train, cfg, total_steps) + evals  # a run that sees a third of the pairs scores a third
        if used:
            if accelerator.is_main_process:  # one process scores and caches, the others read the cache
                source = reference.attach(used)
            accelerator.wait_for_everyone()
            if not accelerator.is_main_process:
                reference.attach(used)
            if len(used) < len(train) + len(evals):
                source += f" for the {len(used) - len(evals)} of {len(train)} training examples the run's steps visit"
    sharded = online_sharded(cfg.model, accelerator)  # the offline path shards by the same rule
    # the hf backend samples from a copy, and a rollout worker is written its weights from one; an engine (vllm) in
    # the trainer is pushed the sharded weights gathered
    whole = BACKENDS[cfg.rollout.backend].samples_trainer_weights or cfg.rollout.max_staleness > 0
    gathered_copy = cfg.online.online and sharded and whole
    sampling_copy = sampling_copy_of(model) if gathered_copy else None
    # the optimizer's state is restored by the offline and online loops' own resume (_run_offline, run_online)
    model, optimizer, scheduler, _ = prepare_trained(model, cfg, accelerator, total_steps, None)
    return DPOSetup(
        accelerator,
        config,
        out,
        start_step,
        checkpoint,
        tokenizer,
        train,
        evals,
        reports,
        model,
        accelerator.unwrap_model(model),
        objective,
        reference,
        source,
        optimizer,
        scheduler,
        total_steps,
        state,
        sampling_copy,
        processor,
        share_prompt,
        rows_note,
    )


def visited_examples(train: list, cfg: DPOConfig, total_steps: int) -> list:
    """The training examples the offline loop's steps will draw (EpochOrder of the run's seed), in file order:
    only these need reference log-probs (online runs keep every example, as before)."""
    if not train or cfg.online.online:
        return train
    order = EpochOrder(len(train), cfg.train.seed)
    drawn = total_steps * cfg.train.batch_size
    if drawn >= len(train):  # an epoch or more: every example
        return train
    return [train[i] for i in sorted(set(order.slice(0, drawn)))]


def loss_name(d) -> str:
    """The plan's loss: a weighted sum spelled out; the two IPOs named by what they compare."""
    if d.loss == "weighted":
        return "weighted: " + " + ".join(f"{w:g} x {name}" for name, w in d.loss_weights.items())
    named = {"ipo": "ipo (summed log-ratios, the paper's form)", "ipo_norm": "ipo_norm (length-normalised: TRL's ipo)"}
    return named.get(d.loss, d.loss)


def dpo_plan(cfg: DPOConfig, s: DPOSetup) -> dict:
    d = cfg.dpo
    return {
        "loss": loss_name(d)
        + f" (β {d.effective_beta:g}"
        + (f", ε {d.label_smoothing:g}" if d.label_smoothing else "")
        + (f", SFT term {d.sft_coef:g}" if d.sft_coef else "")
        + (f", λ_D {d.kto_desirable_weight:g}, λ_U {d.kto_undesirable_weight:g}" if d.loss == "kto" else "")
        + ")",
        "examples (train / eval)": f"{len(s.train)} / {len(s.evals)}"
        + (f" {s.reports[0].format}" if s.reports else ""),
        "reference log-probs": s.reference_source,
        "batch per optimizer step": cfg.train.batch_size,
        "processes x micro-batch x accumulation": cfg.train.micro_batch_plan(s.accelerator.num_processes),
        "micro-batch rows": describe(cfg.model.padding_free) + s.rows_note
        if s.processor is None
        else "padded rows, one response each (a vision-language model's image features fill its own image tokens)",
        "LM head": describe_head(cfg.model.chunked_head),
        "optimizer steps": s.total_steps,
        "model": parameter_summary(s.model)
        + (f", sharded over {s.accelerator.num_processes} processes (FSDP2)" if is_sharded(s.model) else ""),
    }


def pair_collate(setup: DPOSetup, cfg: DPOConfig):
    pad = setup.tokenizer.pad_token_id
    return lambda exs: collate_policy_preferences(exs, pad, cfg.model.padding_free, setup.share_prompt)


def evaluate_pairs(setup: DPOSetup, cfg: DPOConfig) -> dict:
    from tether.train.offline import evaluate as held_out

    if not setup.evals:
        return {}
    return held_out(
        setup.accelerator,
        setup.model,
        setup.evals,
        pair_collate(setup, cfg),
        setup.objective,
        cfg.train.micro_batch_size,
    )


def offline_step(setup: DPOSetup, cfg: DPOConfig, examples: list, order: EpochOrder, step: int) -> dict:
    """One optimizer step on ``examples`` in the offline loop's order and batching."""
    acc, t = setup.accelerator, cfg.train
    per_process = t.batch_size // acc.num_processes
    indices = order.batch(step, t.batch_size)[acc.process_index * per_process : (acc.process_index + 1) * per_process]
    micro, filler = step_micro_batches(
        acc,
        [examples[i] for i in indices],
        pair_collate(setup, cfg),
        loop_settings(cfg.train, setup.total_steps, cfg.optim.max_grad_norm),
    )
    setup.model.train()
    params = [p for p in setup.model.parameters() if p.requires_grad]
    metrics = train_step(
        acc,
        setup.model,
        setup.optimizer,
        setup.scheduler,
        micro,
        setup.objective,
        params,
        cfg.optim.max_grad_norm,
        filler,
    )
    return {**metrics, "train/epoch": order.epoch_at(step + 1, t.batch_size)}


def dpo_summary(cfg: DPOConfig, setup: DPOSetup, last_eval: dict, rounds: list) -> dict:
    return {
        "loss": cfg.dpo.loss,
        "beta": cfg.dpo.effective_beta,
        "train_examples": len(setup.train),
        "eval_examples": len(setup.evals),
        **last_eval,
        "online_rounds": rounds,
        "reference_examples_computed": setup.reference.computed if setup.reference else 0,
        "data": [r.summary() for r in setup.reports],
    }
