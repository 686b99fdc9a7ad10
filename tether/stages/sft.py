"""`tether sft`: supervised fine-tuning with a completion-only loss (docs/algorithms.md §1)."""

from __future__ import annotations

import time

from tether.config import ConfigError
from tether.data.multimodal import refuse_images, text_only, tokenize_multimodal
from tether.data.sft import collate, pack_examples, tokenize_records
from tether.models.checks import check_chunked_head, check_position_restarts
from tether.models.lm import length_limit, load_stage_tokenizer, load_trainable_model, parameter_summary
from tether.models.packing import describe, describe_head
from tether.models.vision import is_vision_language, load_processor
from tether.stages.sft_config import SFTConfig
from tether.train.lm_objective import SFTObjective
from tether.train.offline_run import OfflineRun, plan_steps, prepare_trained, read_split, run_offline
from tether.train.run import start_run
from tether.train.sharding import is_sharded


def load_sft_data(cfg: SFTConfig, tokenizer, processor=None):
    """The train and held-out examples and their reports; with a vision-language model's ``processor``, each with
    its images (data/multimodal.py); without one, a record with images is an error naming it."""
    data = cfg.data
    if not data.path:
        raise ConfigError("--data is required: a .jsonl, .json, .parquet file or a datasets folder")
    if processor is not None and data.packing:
        raise ConfigError(
            "--packing with a vision-language model is not built: its image features fill each row's own image "
            "tokens, so examples are trained in padded rows"
        )

    def tokenize(recs, label, limit):
        if processor is not None:
            return tokenize_multimodal(
                recs, tokenizer, processor, limit, data.train_on_prompt, data.strict, label, cfg.model.max_image_pixels
            )
        refuse_images(recs, text_only(cfg.model.path))
        return tokenize_records(recs, tokenizer, limit, data.train_on_prompt, data.strict, label)

    _, _, train, evals, reports = read_split(cfg, tokenize, images_read=True)
    if data.packing:
        limit = length_limit(data.max_length, cfg.model.path)
        train = pack_examples(train, limit)
        evals = pack_examples(evals, limit) if evals else evals
    return train, evals, reports


def run_sft(cfg: SFTConfig) -> dict:
    """Train, checkpoint, evaluate and write final/; returns the summary."""
    t_start = time.perf_counter()
    tokenizer = load_stage_tokenizer(cfg.model)
    vision = is_vision_language(cfg.model.path)
    processor = load_processor(cfg.model.path, tokenizer, cfg.model.trust_remote_code) if vision else None
    train, evals, reports = load_sft_data(cfg, tokenizer, processor)  # checked before the run folder is touched
    opened = start_run(cfg, {"--model": cfg.model.path, "--data": cfg.data.path, "--output": cfg.train.output})
    accelerator, _, _, start_step, checkpoint = opened
    world = accelerator.num_processes
    total_steps = plan_steps(cfg, accelerator, len(train), start_step, checkpoint)
    model = load_trainable_model(cfg.model, tokenizer, checkpoint)
    padding_free = cfg.model.padding_free and not vision  # a vision model's rows keep their own image tokens
    if padding_free and not cfg.data.packing:
        check_position_restarts(model, cfg.model.path)
    if cfg.model.chunked_head:
        check_chunked_head(model, cfg.model.path, vision)
    model, optimizer, scheduler, _ = prepare_trained(model, cfg, accelerator, total_steps, checkpoint)
    plan = {
        "examples (train / eval)": f"{len(train)} / {len(evals)}" + (" packed rows" if cfg.data.packing else ""),
        "batch per optimizer step": cfg.train.batch_size,
        "processes x micro-batch x accumulation": cfg.train.micro_batch_plan(world),
        "micro-batch rows": "packed rows (--packing)"
        if cfg.data.packing
        else "padded rows, one example each (a vision-language model's image features fill its own image tokens)"
        if vision
        else describe(padding_free),
        "optimizer steps": total_steps,
        "start step": start_step,
        "model": parameter_summary(model) + (f", sharded over {world} processes (FSDP2)" if is_sharded(model) else ""),
        "loss": ("all tokens" if cfg.data.train_on_prompt else "completion tokens only (and EOS)")
        + (", never an image token" if vision else ""),
        "LM head": describe_head(cfg.model.chunked_head),
    }
    if vision:
        plan["vision tower"] = "trained (--train-vision)" if cfg.model.train_vision else "frozen (the projector trains)"
    # a vision model's checkpoints and final/ hold its processor (the tokenizer, the image processor, the template)
    saved = processor if vision else tokenizer
    run = OfflineRun("sft", cfg, opened, total_steps, (model, optimizer, scheduler), saved, t_start)
    return run_offline(
        run,
        plan,
        reports,
        lambda last_eval, steps: {
            "train_examples": len(train),
            "eval_examples": len(evals),
            **last_eval,
            "data": [r.summary() for r in reports],
        },
        train_examples=train,
        eval_examples=evals,
        objective=SFTObjective(cfg.model.chunked_head),
        collate_fn=lambda exs: collate(exs, tokenizer.pad_token_id, padding_free),
    )
