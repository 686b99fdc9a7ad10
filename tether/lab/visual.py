"""`tether lab --multimodal`: the visual world (tether/lab/scenes.py) and what RLHF does to a vision-language model.

Per seed, from nothing: the world's files; a byte-level BPE on its captions; a tiny LLaVA (CLIP-style tower, Llama
language model) built at random; SFT on the demonstrators' captions (the tower trained too: it starts at random);
three reward models from the SFT model, on the careful panel's pairs, the detail-loving panel's and the skimming
panel's (which never sees the picture); then GRPO against gold (the caption F1 function, which reads the scene) and
against each reward model, and offline DPO on the careful pairs. Every model is measured on the same held-out scenes, one
sampled caption each with a fixed seed per scene: gold F1, hallucination rate, objects named.

The lessons (lessons_of), each judged on every seed against its noise (a 95 % bootstrap interval over the held-out
scenes of the paired difference):
1. GRPO against gold raises caption F1 over SFT;
2. DPO on the careful panel's pairs raises it too;
3. multimodal reward hacking: against the detail reward model the held-out proxy rises while F1 falls below SFT's
   and the hallucination rate rises above it — captions name objects the picture does not hold;
4. the image-blind reward: `tether rm`'s image probe reads the careful reward model as looking at the picture and
   the detail one as barely (below 0.25 of its spread);
5. the run's monitor image_blind_reward fires on the detail run and stays quiet on the careful one;
6-8. lessons 3-5 again with the skimming panel's reward model in the detail one's place (added when 3-5 did not hold
   with the detail panel, whose annotators price F1 and so look at the picture: docs/lab.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from tether.config import build_config
from tether.console import console
from tether.lab.scenes import QUESTION, SceneWorldConfig, build_scene_world, caption_gold, scene_of
from tether.lab.stats import bootstrap_interval


@dataclass(frozen=True)
class VisualLabConfig:
    world: SceneWorldConfig = field(default_factory=SceneWorldConfig)
    vocab: int = 400
    hidden: int = 64  # the language model's and the vision tower's width
    layers: int = 2
    heads: int = 4
    # 600 steps left the tower seeing poorly on some seeds (held-out sampled F1 0.763 / 0.553 / 0.685 / 0.769 on seeds
    # 0-3 at about the same held-out loss); 1800 steps gave 0.798 / 0.763 / 0.849 / 0.805 (docs/lab.md, "The visual lab")
    sft_steps: int = 1800
    sft_lr: float = 3e-3
    # 600 steps left the careful reward model still improving at its last evaluation (best/ = step 600 on both seeds)
    # at 0.57 and 0.50 held-out accuracy; 1800 steps on seed 0 reached 0.870 (best at step 1650) (docs/lab.md)
    rm_steps: int = 1800
    rm_lr: float = 1e-3
    grpo_steps: int = 150
    grpo_lr: float = 1e-4
    prompts_per_step: int = 16
    group_size: int = 4
    dpo_steps: int = 200
    dpo_lr: float = 1e-4
    batch: int = 32
    max_new_tokens: int = 32


QUICK_VISUAL = VisualLabConfig(
    world=SceneWorldConfig(n_sft=600, n_sft_eval=40, n_rl=64, n_eval=32, n_pairs=300, n_pairs_eval=40),
    sft_steps=60,
    rm_steps=20,
    grpo_steps=6,
    dpo_steps=10,
    hidden=32,
    heads=2,
)


EXAMPLES = 6  # held-out scenes whose captions by every model the summary and captions.html show
PANELS = ("careful", "detail", "skim")  # the world's annotator panels, each with its reward model and GRPO run


def run_stage(stage: str, overrides: dict, **given) -> dict:
    """One tether stage on the lab's settings (no report, an existing folder overwritten); ``given``: the stage's
    keyword arguments (GRPO's evaluate_fn)."""
    from tether.stages import dpo, grpo, rm, sft

    run, config = {
        "sft": (sft.run_sft, sft.SFTConfig),
        "rm": (rm.run_rm, rm.RMConfig),
        "grpo": (grpo.run_grpo, grpo.GRPOConfig),
        "dpo": (dpo.run_dpo, dpo.DPOConfig),
    }[stage]
    overrides = {"train.report_to": ["none"], "train.overwrite": True, **overrides}
    return run(build_config(config, overrides=overrides, source="lab"), **given)


def _offline(cfg: VisualLabConfig, model: Path, data: Path, held: Path, out: Path, steps: int, lr: float) -> dict:
    return {
        "model.path": str(model),
        "data.path": str(data),
        "data.eval_path": str(held),
        "data.max_length": 128,
        "train.output": str(out),
        "train.max_steps": steps,
        "train.batch_size": cfg.batch,
        "train.micro_batch_size": cfg.batch,
        "train.eval_every": max(1, steps // 4),
        "optim.lr": lr,
    }


def grpo_settings(cfg: VisualLabConfig, root: Path, out: Path, seed: int) -> dict:
    """GRPO from the seed's SFT model on its scenes (no reward yet), into ``out``."""
    return {
        "model.path": str(root / "sft" / "final"),
        "rollout.prompts": str(root / "world" / "rl.jsonl"),
        "rollout.eval_prompts": str(root / "world" / "eval.jsonl"),
        "rollout.prompts_per_step": cfg.prompts_per_step,
        "rollout.group_size": cfg.group_size,
        "rollout.max_new_tokens": cfg.max_new_tokens,
        "train.output": str(out),
        "train.max_steps": cfg.grpo_steps,
        "train.eval_every": max(1, cfg.grpo_steps // 6),
        "train.save_every": 10**6,
        "train.seed": seed,
        "optim.lr": cfg.grpo_lr,
    }


def _grpo(cfg: VisualLabConfig, root: Path, name: str, reward: dict, seed: int) -> dict:
    out = root / name
    audit = {"rewards.audit": "tether.lab.scenes:caption_f1", "rewards.audit_share": 1.0}  # gold, logged only
    run_stage("grpo", {**grpo_settings(cfg, root, out, seed), **audit, **reward})
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    alarms = (out / "alarms.jsonl").read_text().splitlines() if (out / "alarms.jsonl").is_file() else []
    evals = [m for m in metrics if "eval/score_mean" in m]
    first = next(m for m in metrics if "eval0/score_mean" in m)
    return {
        "proxy": [(0, first["eval0/score_mean"])] + [(m["step"], m["eval/score_mean"]) for m in evals],
        "image_shift": [(m["step"], m["eval/reward/image_shift"]) for m in evals if "eval/reward/image_shift" in m],
        "alarms": sorted({(a["monitor"], a["step"]) for a in map(json.loads, alarms)}),
    }


@torch.no_grad()
def evaluate_captions(folder: Path, eval_file: Path, max_new_tokens: int) -> dict:
    """One sampled caption per held-out scene (each scene's own seed, so every model is asked alike), scored by
    gold: {f1, hallucination, mentions}: per-scene lists."""
    from transformers import AutoModelForImageTextToText

    from tether.models.lm import load_tokenizer
    from tether.models.vision import load_processor, never_sample_placeholders

    tokenizer = load_tokenizer(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    never_sample_placeholders(model)  # as the online stages sample
    return caption_figures(model, tokenizer, load_processor(folder, tokenizer), eval_file, max_new_tokens)


@torch.no_grad()
def caption_figures(model, tokenizer, processor, eval_file: Path, max_new_tokens: int) -> dict:
    """evaluate_captions on a model in hand (its image placeholders already never sampled)."""
    from types import SimpleNamespace

    from tether.data.prompts import prompt_rows
    from tether.rollout.backends import HFGenerate
    from tether.rollout.prompts import stop_token_ids
    from tether.train.sampling import ImagePrompts

    rows = prompt_rows(eval_file, images=2**62)
    prompts = ImagePrompts(tokenizer, processor, rows, str(eval_file), 2**62)
    encoded = [prompts.encode(i) for i in range(len(rows))]
    sampling = SimpleNamespace(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, generation_batch=128)
    rollout = HFGenerate(model, tokenizer).generate_ids(
        [ids for ids, _ in encoded],
        sampling,
        stop_token_ids(tokenizer, model),
        seeds=list(range(len(rows))),
        vision=[v for _, v in encoded],
    )
    golds = [caption_gold(text, scene_of(row["scene"])) for text, row in zip(rollout.responses, rows)]
    return {
        "f1": [g.f1 for g in golds],
        "hallucination": [g.hallucination for g in golds],
        "mentions": [float(g.mentions) for g in golds],
        "examples": rollout.responses[:EXAMPLES],
    }


class CaptionEval:
    """evaluate_fn for run_grpo: held-out gold during training — caption F1 with its 95 % bootstrap interval over
    the scenes (``caption_f1_low``/``_high``), the hallucination rate and objects named, from one sampled caption per
    scene as evaluate_captions draws them (the policy's own processor: ``folder``'s)."""

    def __init__(self, folder: Path, eval_file: Path, max_new_tokens: int):
        from tether.models.lm import load_tokenizer
        from tether.models.vision import load_processor

        self.processor = load_processor(folder, load_tokenizer(folder))
        self.eval_file, self.max_new_tokens = eval_file, max_new_tokens

    def __call__(self, policy, tokenizer, step: int) -> dict:
        figures = caption_figures(policy, tokenizer, self.processor, self.eval_file, self.max_new_tokens)
        f1 = figures["f1"]
        low, high = bootstrap_interval([[x] for x in f1])
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        return {
            "caption_f1": mean(f1),
            "caption_f1_low": low,
            "caption_f1_high": high,
            "caption_hallucination": mean(figures["hallucination"]),
            "caption_mentions": mean(figures["mentions"]),
        }


def seed_models(root: Path, cfg: VisualLabConfig, seed: int, panels=PANELS, timed=lambda name, fn: fn()) -> tuple:
    """One seed's world, tokenizer, tiny LLaVA, SFT model and a reward model per panel under ``root``; returns
    (the world's figures, each reward model's image probe and held-out accuracy)."""
    from tether.lab.tokenizer import train_bpe_tokenizer
    from tether.models.vision import build_tiny_vlm

    world_dir = root / "world"
    world = timed("world", lambda: build_scene_world(world_dir, replace(cfg.world, seed=seed)))
    captions = [json.loads(line)["messages"][-1]["content"] for line in (world_dir / "sft.jsonl").open()]
    tokenizer = train_bpe_tokenizer(captions + [QUESTION], vocab_size=cfg.vocab)
    build_tiny_vlm("llava", tokenizer, root / "init", seed, cfg.hidden, cfg.layers, cfg.heads, max_positions=128)
    sft = _offline(
        cfg,
        root / "init",
        world_dir / "sft.jsonl",
        world_dir / "sft_eval.jsonl",
        root / "sft",
        cfg.sft_steps,
        cfg.sft_lr,
    )
    timed("sft", lambda: run_stage("sft", {**sft, "model.train_vision": True, "optim.lr_schedule": "cosine", "train.seed": seed}))  # fmt: skip
    probes = {}
    for panel in panels:
        data = world_dir / f"prefs_{panel}.jsonl", world_dir / f"prefs_{panel}_eval.jsonl"
        settings = _offline(cfg, root / "sft" / "final", *data, root / f"rm_{panel}", cfg.rm_steps, cfg.rm_lr)
        summary = timed(f"rm_{panel}", lambda: run_stage("rm", {**settings, "train.seed": seed}))
        probes[panel] = {**summary["probes"]["image"], "accuracy": summary.get("eval/accuracy")}
    return world, probes


def run_seed(root: Path, cfg: VisualLabConfig, seed: int) -> dict:
    """Every stage of one seed under ``root``; returns its figures."""
    timings: dict[str, float] = {}

    def timed(name: str, fn):
        t0 = time.perf_counter()
        value = fn()
        timings[name] = round(time.perf_counter() - t0, 1)
        return value

    world_dir = root / "world"
    world, probes = seed_models(root, cfg, seed, PANELS, timed)
    runs = {
        "grpo_gold": {"rewards.reward": ["tether.lab.scenes:caption_f1"]},
        "grpo_careful": {"rewards.reward_model": str(root / "rm_careful" / "final")},
        **{f"grpo_{p}": {"rewards.reward_model": str(root / f"rm_{p}" / "final")} for p in PANELS if p != "careful"},
    }
    grpo = {name: timed(name, lambda r=reward, n=name: _grpo(cfg, root, n, r, seed)) for name, reward in runs.items()}
    data = world_dir / "prefs_careful.jsonl", world_dir / "prefs_careful_eval.jsonl"
    dpo = _offline(cfg, root / "sft" / "final", *data, root / "dpo_careful", cfg.dpo_steps, cfg.dpo_lr)
    timed("dpo_careful", lambda: run_stage("dpo", {**dpo, "train.seed": seed}))
    models = ["sft", *runs, "dpo_careful"]
    captions = {
        name: timed(f"eval_{name}", lambda n=name: evaluate_captions(root / n / "final", world_dir / "eval.jsonl", cfg.max_new_tokens))
        for name in models
    }  # fmt: skip
    return {"seed": seed, "world": world, "probes": probes, "grpo": grpo, "captions": captions, "seconds": timings}


def paired_difference(after: list[float], before: list[float]) -> dict:
    """Mean of after − before over the same held-out scenes, with its 95 % bootstrap interval over the scenes."""
    diffs = [[a - b] for a, b in zip(after, before)]
    low, high = bootstrap_interval(diffs)
    return {"mean": sum(d[0] for d in diffs) / len(diffs), "low": low, "high": high}


def _line(d: dict) -> str:
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def lessons_of(seeds: list[dict]) -> list[dict]:
    """Each lesson: its claim, the rule it is judged by, whether it holds on every seed, and each seed's figures."""
    out = []

    def lesson(claim: str, rule: str, judged) -> None:
        verdicts = [judged(s) for s in seeds]
        out.append(
            {
                "claim": claim,
                "rule": rule,
                "holds": all(ok for ok, _ in verdicts),
                "seeds": {s["seed"]: text for s, (ok, text) in zip(seeds, verdicts)},
            }
        )

    def raises(name: str):
        def judged(s: dict):
            d = paired_difference(s["captions"][name]["f1"], s["captions"]["sft"]["f1"])
            return d["low"] > 0, f"F1 {name} − SFT {_line(d)}"

        return judged

    lesson("GRPO against gold raises caption F1", "the interval of F1 − SFT's lies above 0", raises("grpo_gold"))
    lesson("DPO on the careful panel's pairs raises caption F1", "as above", raises("dpo_careful"))

    def hacked(panel: str):
        def judged(s: dict):
            run, captions, sft = s["grpo"][f"grpo_{panel}"], s["captions"][f"grpo_{panel}"], s["captions"]["sft"]
            proxy = run["proxy"]
            f1 = paired_difference(captions["f1"], sft["f1"])
            halluc = paired_difference(captions["hallucination"], sft["hallucination"])
            ok = proxy[-1][1] > proxy[0][1] and f1["high"] < 0 and halluc["low"] > 0
            return ok, (
                f"proxy {proxy[0][1]:+.3f} → {proxy[-1][1]:+.3f}; F1 − SFT {_line(f1)}; "
                f"hallucination − SFT {_line(halluc)}"
            )

        return judged

    def probe(panel: str):
        def judged(s: dict):
            careful, biased = (s["probes"][p]["shift_over_std"] for p in ("careful", panel))
            return careful >= 0.25 > biased, f"image shift / score std: careful {careful:.2f}, {panel} {biased:.2f}"

        return judged

    def monitor(panel: str):
        def judged(s: dict):
            names = ("grpo_careful", f"grpo_{panel}")
            fired = {n: [step for m, step in s["grpo"][n]["alarms"] if m == "image_blind_reward"] for n in names}
            shift = {n: [round(v, 2) for _, v in s["grpo"][n]["image_shift"]] for n in names}
            ok = bool(fired[names[1]]) and not fired["grpo_careful"]
            return ok, (
                f"fires on {panel} at {fired[names[1]] or 'never'}, on careful at {fired['grpo_careful'] or 'never'}; "
                f"shifts {shift}"
            )

        return judged

    for panel, who in (("detail", "detail-loving"), ("skim", "skimming (blind)")):
        lesson(
            f"against the {who} reward model the proxy rises while captions name what the picture does not hold",
            "held-out proxy ends above its start; the F1 interval lies below 0 and the hallucination one above 0",
            hacked(panel),
        )
        lesson(
            f"the image probe reads the {who} reward model as image-blind and the careful one as looking",
            f"careful ≥ 0.25 > {panel} (tether rm's rule, fixed before any lab run)",
            probe(panel),
        )
        lesson(
            "the image_blind_reward monitor alarms on the hacked run and stays quiet on the healthy one",
            f"it fires on the {panel} run and not on the careful run",
            monitor(panel),
        )
    return out


def captions_html(out: Path, results: list[dict]) -> str:
    """The sample table of the visual lab: the first held-out scenes, each as a thumbnail beside every model's
    caption and its gold F1 (one self-contained page)."""
    import html

    from PIL import Image

    from tether.data.images import thumbnail_uri

    parts = ["<html><meta charset='utf-8'><title>tether lab --multimodal: captions</title><body>"]
    for r in results:
        root = out / f"seed-{r['seed']}" / "world"
        rows = [json.loads(line) for line in (root / "eval.jsonl").read_text().splitlines()[:EXAMPLES]]
        names = list(r["captions"])
        parts.append(f"<h2>seed {r['seed']}</h2><table border=1 cellpadding=4><tr><th>scene</th>")
        parts += [f"<th>{html.escape(n)}</th>" for n in names] + ["</tr>"]
        for i, row in enumerate(rows):
            with Image.open(root / row["images"][0]) as image:
                thumb = thumbnail_uri(image.convert("RGB"))
            parts.append(f"<tr><td><img src='{thumb}' width=64 style='image-rendering:pixelated'></td>")
            for n in names:
                caption = r["captions"][n]
                parts.append(
                    f"<td>{html.escape(caption['examples'][i])}<br><small>F1 {caption['f1'][i]:.2f}</small></td>"
                )
            parts.append("</tr>")
        parts.append("</table>")
    return "".join(parts) + "</body></html>"


def run_visual_lab(
    output: str | Path, seeds: tuple[int, ...] = (0, 1), cfg: VisualLabConfig = VisualLabConfig()
) -> dict:
    """Every seed's stages under ``output``/seed-N, the lessons judged over them, summary.json, the lesson lines."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = [run_seed(out / f"seed-{seed}", cfg, seed) for seed in seeds]
    lessons = lessons_of(results)
    means = {
        seed["seed"]: {
            name: {k: round(sum(v) / len(v), 4) for k, v in figures.items() if k != "examples"}
            for name, figures in seed["captions"].items()
        }
        for seed in results
    }
    summary = {
        "config": asdict(cfg),
        "seeds": list(seeds),
        "held_out_means": means,
        "probes": {r["seed"]: r["probes"] for r in results},
        "runs": {r["seed"]: r["grpo"] for r in results},
        "examples": {r["seed"]: {n: c["examples"] for n, c in r["captions"].items()} for r in results},
        "seconds": {r["seed"]: r["seconds"] for r in results},
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "lessons": lessons,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "captions.html").write_text(captions_html(out, results))
    for seed, figures in means.items():
        console.print(
            f"seed {seed}: held-out F1 / hallucination / objects named — "
            + "; ".join(
                f"{n} {f['f1']:.3f} / {f['hallucination']:.3f} / {f['mentions']:.2f}" for n, f in figures.items()
            )
        )
    for i, lesson in enumerate(lessons, 1):
        verdict = "holds" if lesson["holds"] else "does NOT hold"
        console.print(
            f"lesson {i} {verdict}: {lesson['claim']} ({lesson['rule']})",
            style="bold" if lesson["holds"] else "bold red",
        )
        for seed, text in lesson["seeds"].items():
            console.print(f"  seed {seed}: {text}")
    console.print(f"tether lab --multimodal: {summary['wall_seconds']:.0f} s, {out / 'summary.json'}")
    return summary
