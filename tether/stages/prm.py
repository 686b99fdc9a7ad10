"""`tether prm`: process reward models from step-labelled solutions (docs/algorithms.md §2.4,
docs/reward-models.md "Process reward models").

Its own stage rather than a flag of `tether rm`: the data (steps and labels, not pairs), the loss (one binary
cross-entropy per step, not a comparison) and the evaluation (step accuracy, AUROC, first wrong step) share nothing
with preference training but the model class. The model is a reward model with one head, ``step``, read at each
step's last token; final/ is a reward-model folder (``--process-reward-model`` takes it).
"""

from __future__ import annotations

import time

import torch

from tether.algorithms.reward import binary_auroc, first_wrong_step, step_bce_loss
from tether.config import ConfigError
from tether.data.multimodal import refuse_images, text_only
from tether.data.steps import collate_steps, tokenize_steps
from tether.models.lm import load_stage_tokenizer, parameter_summary
from tether.models.packing import VISION_INPUTS
from tether.models.reward import STEP_HEAD, STEP_SEPARATOR_KEY, load_trainable_reward_model, save_reward_model
from tether.models.vision import is_vision_language, load_processor, on_model
from tether.stages.prm_config import PRMConfig
from tether.train.checkpoint import write_atomically
from tether.train.offline_run import OfflineRun, plan_steps, prepare_trained, read_split, run_offline
from tether.train.run import start_run


class StepObjective:
    """Σ of per-step binary cross-entropies over the batch's labelled steps; the loop divides by the step count."""

    unit = "steps"

    def count(self, batch: dict) -> int:
        return int(batch["step_mask"].sum())

    def loss_sum(self, model, batch: dict):
        logits = step_logits(model, batch)  # (B, S)
        mask = batch["step_mask"]
        losses = step_bce_loss(logits, batch["step_labels"], mask)
        right = ((logits > 0) == (batch["step_labels"] >= 0.5)) & mask.bool()
        return losses.sum(), {"step_accuracy": right.float().sum()}


def step_logits(model, batch: dict) -> torch.Tensor:
    """(B, S) logits of the ``step`` head at each row's step positions; a vision-language model's rows with their
    pixels (data/steps.py collate_steps)."""
    vision = {k: batch[k] for k in VISION_INPUTS if k in batch}
    return model(batch["input_ids"], batch["attention_mask"], step_index=batch["step_index"], **vision)[..., 0]


@torch.no_grad()
def evaluate_prm(model, examples, pad_id: int, micro: int, device) -> dict[str, float]:
    """Held-out loss per step, step accuracy (p > 1/2 against label >= 1/2), AUROC of p over the steps, and the
    share of solutions whose first predicted wrong step is their first wrong step (or none, for both)."""
    model.eval()
    probs, labels, masks, loss, n = [], [], [], 0.0, 0
    for start in range(0, len(examples), micro):
        batch = {k: v.to(device) for k, v in collate_steps(examples[start : start + micro], pad_id).items()}
        logits = step_logits(model, on_model(model, batch))
        loss += float(step_bce_loss(logits, batch["step_labels"], batch["step_mask"]).sum())
        n += int(batch["step_mask"].sum())
        for row_p, row_y, row_m in zip(
            torch.sigmoid(logits).cpu(), batch["step_labels"].cpu(), batch["step_mask"].cpu()
        ):
            probs.append(row_p[row_m.bool()])
            labels.append(row_y[row_m.bool()] >= 0.5)
            masks.append(int(row_m.sum()))
    model.train()
    if not n:
        return {}
    p, y = torch.cat(probs), torch.cat(labels)
    first_right = 0
    for row_p, row_y in zip(probs, labels):
        mask = torch.ones(1, len(row_p), dtype=torch.long)
        first_right += int(first_wrong_step((row_p > 0.5)[None], mask)[0] == first_wrong_step(row_y[None], mask)[0])
    return {
        "eval/loss": loss / n,
        "eval/step_accuracy": float(((p > 0.5) == y).float().mean()),
        "eval/auroc": binary_auroc(p, y),
        "eval/first_wrong_step_accuracy": first_right / len(probs),
        "eval/wrong_step_share": float((~y).float().mean()),
    }


def load_prm_data(cfg: PRMConfig, tokenizer, processor=None):
    """Train and held-out solutions; with a vision-language model's ``processor``, each prompt's images."""
    d = cfg.data
    if not d.path:
        raise ConfigError("--data is required: step-labelled solutions (prompt, completions, labels)")
    pixels = cfg.model.max_image_pixels

    def tokenize(recs, label, limit):
        if processor is None:
            refuse_images(recs, text_only(cfg.model.path))
        return tokenize_steps(recs, tokenizer, limit, d.step_separator, d.strict, label, processor, pixels)

    _, _, train, evals, reports = read_split(cfg, tokenize, images_read=True)
    return train, evals, reports


def run_prm(cfg: PRMConfig) -> dict:
    """Train, checkpoint, evaluate and write final/ (a reward-model folder with one head, ``step``)."""
    t_start = time.perf_counter()
    if not cfg.model.path:
        raise ConfigError("--model is required")
    if cfg.model.fsdp:
        raise ConfigError("--fsdp: tether prm does not shard yet; its processes are data-parallel replicas")
    tokenizer = load_stage_tokenizer(cfg.model)
    vision = is_vision_language(cfg.model.path)  # each solution read with its prompt's images
    processor = load_processor(cfg.model.path, tokenizer, cfg.model.trust_remote_code) if vision else None
    train, evals, reports = load_prm_data(cfg, tokenizer, processor)  # checked before the run folder is touched
    opened = start_run(cfg, {"--output": cfg.train.output})
    accelerator, _, out, start_step, checkpoint = opened
    total_steps = plan_steps(cfg, accelerator, len(train), start_step, checkpoint)
    model = load_trainable_reward_model(cfg.model, tokenizer, [STEP_HEAD], checkpoint)
    # every folder the run writes says what followed each step, so --process-reward-model reads steps where trained
    setattr(model.inner.config, STEP_SEPARATOR_KEY, cfg.data.step_separator)
    model, optimizer, scheduler, _ = prepare_trained(model, cfg, accelerator, total_steps, checkpoint)
    plan = {
        "examples (train / eval)": f"{len(train)} / {len(evals)} {reports[0].format} solutions, "
        f"{sum(len(e.labels) for e in train)} / {sum(len(e.labels) for e in evals)} labelled steps",
        "step separator": repr(cfg.data.step_separator),
        "loss": "binary cross-entropy per step at its last token (docs/algorithms.md §2.4)",
        "batch per optimizer step": cfg.train.batch_size,
        "processes x micro-batch x accumulation": cfg.train.micro_batch_plan(accelerator.num_processes),
        "optimizer steps": total_steps,
        "start step": start_step,
        "model": parameter_summary(model),
    }
    if vision:
        plan["rows"] = "padded, one solution each (a vision-language model's image features fill its own image tokens)"
        plan["vision tower"] = "trained (--train-vision)" if cfg.model.train_vision else "frozen (the projector trains)"
    saved_with = processor or tokenizer  # a vision model's folders hold its processor (tokenizer, image processor)
    unwrapped, pad_id = accelerator.unwrap_model(model), tokenizer.pad_token_id
    micro, device = cfg.train.micro_batch_size, accelerator.device

    def save(summary: dict) -> None:  # a reward-model folder with its one head (process 0: prm does not shard)
        if accelerator.is_main_process:
            write_atomically(lambda tmp: save_reward_model(unwrapped, saved_with, tmp, None), out / "final")

    run = OfflineRun("prm", cfg, opened, total_steps, (model, optimizer, scheduler), saved_with, t_start)
    return run_offline(
        run,
        plan,
        reports,
        lambda last_eval, steps: {**last_eval, "data": [r.summary() for r in reports]},
        save,
        train_examples=train,
        eval_examples=evals,
        objective=StepObjective(),
        collate_fn=lambda exs: collate_steps(exs, pad_id),
        evaluate_fn=lambda step: evaluate_prm(unwrapped, evals, pad_id, micro, device),
    )
