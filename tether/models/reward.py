"""Reward models: a scalar head per objective on a causal-LM backbone, scored at the last real token.

Stored as a standard Hugging Face sequence-classification folder (one label per
head, `id2label` naming the heads), so `AutoModelForSequenceClassification`
loads it; `reward_normalization.json` beside it holds per-head score mean and std.

The score is read at the last position whose attention-mask entry is 1 and
position ids come from the mask, so padding side and amount change nothing
(transformers' own classifier heads find the last token through the pad id,
which breaks when pad equals EOS).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification

from tether.algorithms.logprobs import at_least_float32
from tether.algorithms.masks import last_action_index
from tether.config import ConfigError
from tether.models.cpu import refuse_bf16_attention_where_torch_cannot
from tether.models.folders import check_dir, check_model_folder
from tether.models.lm import DTYPES, is_peft, lora_config
from tether.models.packing import pad_sequences, tree_attention_mask
from tether.models.shards import is_sharded, reshard
from tether.models.vision import VISION_TOWER_MODULES, freeze_vision_tower, is_vision_language, load_processor

NORM_FILE = "reward_normalization.json"
STEP_HEAD = "step"  # a process reward model's one head (`tether prm`)
STEP_SEPARATOR_KEY = "tether_step_separator"  # in a process reward model's config.json: what ended its steps
VISION_HEADS_KEY = "tether_reward_heads"  # in a vision-language reward model's config.json: its heads, in order


class RewardModel(nn.Module):
    """Wraps a *ForSequenceClassification model (or a peft model of one); forward returns (B, heads) scores."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @property
    def inner(self):
        return self.model.get_base_model() if is_peft(self.model) else self.model

    @property
    def head_names(self) -> list[str]:
        cfg = self.inner.config
        return [cfg.id2label[i] for i in range(cfg.num_labels)]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        last_index: torch.Tensor | None = None,
        step_index: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        **vision: torch.Tensor,
    ) -> torch.Tensor:
        """(sequences, heads) scores at each sequence's last token: of padded rows (attention_mask, left or right
        padding) or of packed rows (position_ids restarting per sequence, last_index: tether/models/packing.py; with
        ``tree_mask`` a prompt's responses after one copy of it, packing.SharedPrompts).
        With ``step_index`` (B, S): (B, S, heads) scores at each row's step positions (step_scores). ``vision``: a
        vision-language backbone's pixel tensors (models/vision.py VISION_INPUTS; padded rows). Through forward, so
        data-parallel and sharded wrappers see the call."""
        if step_index is not None:
            return self.step_scores(input_ids, attention_mask, step_index, **vision)
        inner = self.inner
        if last_index is not None:  # packed rows, or (tree_mask) responses after one copy of their prompt
            mask = tree_attention_mask(inner.base_model, tree_mask) if tree_mask is not None else None
            hidden = inner.base_model(
                input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
            ).last_hidden_state  # (R, W, H)
            return at_least_float32(self.score_head(hidden.reshape(-1, hidden.shape[-1])[last_index]))  # (n, heads)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T), 0 at the first real token
        hidden = inner.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **vision
        ).last_hidden_state  # (B, T, H)
        last = last_action_index(attention_mask).clamp(min=0)  # (B,) last real token, for left or right padding
        pooled = hidden[torch.arange(input_ids.shape[0], device=input_ids.device), last]  # (B, H)
        return at_least_float32(self.score_head(pooled))  # (B, heads)

    def step_scores(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, step_index: torch.Tensor, **vision: torch.Tensor
    ):
        """(B, S, heads) logits at each row's step positions (``step_index`` (B, S), right-padded rows): a process
        reward model's score of every step in one forward (tether/data/steps.py); ``vision`` as forward's."""
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.inner.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **vision
        ).last_hidden_state  # (B, T, H)
        at = step_index.clamp(max=hidden.shape[1] - 1)
        picked = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, S, H)
        return at_least_float32(self.score_head(picked))

    @property
    def score_head(self):
        head = getattr(self.inner, "score", None)
        if head is None:
            raise ConfigError(
                f"{type(self.inner).__name__} has no 'score' head; tether's reward models need an "
                "architecture whose sequence-classification class names its head 'score' (llama, qwen2, gpt2, mistral, ...)"
            )
        return head

    def save_pretrained(self, folder: str | Path, **kwargs) -> None:
        self.model.save_pretrained(str(folder), **kwargs)


def load_reward_model(
    path: str | Path,
    tokenizer,
    head_names: list[str] | None = None,
    dtype: str = "float32",
    trust_remote_code: bool = False,
) -> RewardModel:
    """From a reward-model folder (heads as saved) or a causal-LM folder (new, zero-initialised heads)."""
    path = check_dir(path, "model")
    check_model_folder(path, "reward model" if (path / "reward_normalization.json").is_file() else "model")
    torch_dtype = "auto" if dtype == "auto" else DTYPES[dtype]
    if is_vision_language(path):
        model = _vision_reward_model(path, head_names, torch_dtype, trust_remote_code)
        return RewardModel(_fit_tokenizer(model, tokenizer, dtype, path))
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    is_rm = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
    if is_rm:
        saved = [config.id2label[i] for i in range(config.num_labels)]
        if head_names and list(head_names) != saved:
            raise ConfigError(f"{path} is a reward model with heads {saved}; --heads {head_names} does not match")
        model = AutoModelForSequenceClassification.from_pretrained(
            str(path), dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
    else:
        names = list(head_names or ["reward"])
        model = AutoModelForSequenceClassification.from_pretrained(
            str(path),
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
            dtype=torch_dtype,
            trust_remote_code=trust_remote_code,
        )
        with torch.no_grad():
            model.score.weight.zero_()  # every head starts at score 0: no arbitrary initial preference
            if getattr(model.score, "bias", None) is not None:
                model.score.bias.zero_()
    return RewardModel(_fit_tokenizer(model, tokenizer, dtype, path))


def _fit_tokenizer(model, tokenizer, dtype: str, path: Path):
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    if next(model.parameters()).dtype == torch.bfloat16:
        refuse_bf16_attention_where_torch_cannot(model, f"dtype={dtype} (reward model {path}: bf16 weights)")
    return model


def _vision_reward_model(path: Path, head_names: list[str] | None, dtype, trust_remote_code: bool):
    """A vision-language model with tether's head: ``score``, a bias-free linear map from the language model's last
    hidden state to one score per head, an attribute of the model (so it saves with the weights, as
    ``score.weight``). Transformers has no sequence-classification class for most vision-language models; this is
    that class's head on any of them. The heads are named in config.json (``tether_reward_heads``); a folder without
    them (a vision-language model) gets new zero heads."""
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    saved = json.loads((path / "config.json").read_text()).get(VISION_HEADS_KEY)
    if saved and head_names and list(head_names) != saved:
        raise ConfigError(f"{path} is a reward model with heads {saved}; --heads {head_names} does not match")
    names = list(saved or head_names or ["reward"])
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust_remote_code)
    hidden = model.config.get_text_config().hidden_size
    model.score = nn.Linear(hidden, len(names), bias=False, dtype=model.get_input_embeddings().weight.dtype)
    with torch.no_grad():
        model.score.weight.zero_()  # every head starts at score 0: no arbitrary initial preference
        if saved:  # the weights loader left score.weight out (the class names no such module): read it here
            index = path / "model.safetensors.index.json"
            file = (
                json.loads(index.read_text())["weight_map"]["score.weight"] if index.is_file() else "model.safetensors"
            )
            with safe_open(str(path / file), framework="pt") as weights:
                model.score.weight.copy_(weights.get_tensor("score.weight"))
    model.config.id2label, model.config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}
    setattr(model.config, VISION_HEADS_KEY, names)
    return model


def load_trainable_reward_model(model_cfg, tokenizer, heads: list[str], checkpoint) -> "RewardModel":
    """The reward model to train (`tether rm`, `tether prm`): from --model with new heads, or from a checkpoint when
    resuming (LoRA: base + saved adapter); dropout off unless keep_dropout; precision as the model section says."""
    from tether.console import loading
    from tether.models.lm import apply_precision, disable_dropout

    m = model_cfg
    loading(f"the reward model to train from {checkpoint if checkpoint is not None and m.lora_r <= 0 else m.path}")
    if m.lora_r > 0:
        rm = load_reward_model(m.path, tokenizer, heads, m.dtype, m.trust_remote_code)
        if checkpoint is not None:
            from peft import PeftModel

            rm = RewardModel(PeftModel.from_pretrained(rm.model, str(checkpoint), is_trainable=True))
        else:
            rm = apply_reward_lora(rm, m.lora_r, m.lora_alpha, m.lora_dropout, list(m.lora_target_modules))
    else:
        rm = load_reward_model(checkpoint or m.path, tokenizer, heads, m.dtype, m.trust_remote_code)
    if not m.keep_dropout:
        disable_dropout(rm)
    if hasattr(rm.inner.config, VISION_HEADS_KEY) and not m.train_vision and m.lora_r <= 0:
        freeze_vision_tower(rm.inner)  # as a vision-language policy's: the projector trains, the encoder stays
    return apply_precision(rm, m)


def apply_reward_lora(rm: RewardModel, r: int, alpha: float, dropout: float, target_modules: list[str]) -> RewardModel:
    from peft import get_peft_model

    vision = hasattr(rm.model.config, VISION_HEADS_KEY)  # adapters on the language model and projector only
    exclude = {"exclude_modules": VISION_TOWER_MODULES} if vision else {}
    cfg = lora_config(r, alpha, dropout, target_modules, "SEQ_CLS", modules_to_save=["score"], **exclude)
    return RewardModel(get_peft_model(rm.model, cfg))


def save_reward_model(rm: RewardModel, tokenizer, folder: str | Path, normalization: dict | None) -> None:
    """A plain sequence-classification folder (LoRA merged) with the tokenizer and normalisation statistics."""
    model = rm.model
    if is_peft(model):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    if normalization is not None:
        (Path(folder) / NORM_FILE).write_text(json.dumps(normalization, indent=2))


def load_normalization(folder: str | Path) -> dict:
    path = Path(folder) / NORM_FILE
    if not path.is_file():
        raise ConfigError(
            f"reward normalisation was asked for but {path} does not exist; it is written by `tether rm` "
            "at the end of training (or turn normalisation off)"
        )
    return json.loads(path.read_text())


@torch.no_grad()
def score_texts(
    rm: RewardModel, tokenizer, texts: list[str], batch_size: int = 32, max_length: int = 1024
) -> torch.Tensor:
    """(N, heads) scores of full texts (prompt and response already rendered), in the order given.

    Each distinct text is scored once, and texts go through the model in batches of similar length (sorted by
    token count), so a batch pads little: the score of a text does not depend on its batch (tested)."""
    distinct = list(dict.fromkeys(texts))
    ids = tokenizer(distinct, add_special_tokens=False)["input_ids"] if distinct else []
    check_lengths(ids, max_length, lambda i: texts.index(distinct[i]))
    scores = score_token_ids(rm, ids, tokenizer.pad_token_id, batch_size)
    index = {text: i for i, text in enumerate(distinct)}
    return scores[[index[t] for t in texts]] if texts else torch.zeros(0, len(rm.head_names))


def check_lengths(ids: list[list[int]], max_length: int, position=lambda i: i) -> None:
    """A ConfigError naming the first text longer than max_length (``position`` maps to the caller's numbering)."""
    for i, row in enumerate(ids):
        if len(row) > max_length:
            raise ConfigError(
                f"text {position(i)} is longer than max_length={max_length} tokens; reward models score "
                "whole texts and never truncate them silently"
            )


@torch.no_grad()
def score_token_ids(rm: RewardModel, ids: list[list[int]], pad_id: int, batch_size: int = 32) -> torch.Tensor:
    """(N, heads) scores of tokenised texts, in the order given, through the model in batches of similar length.

    A sharded model (--fsdp) gathers each layer in every forward, a collective: every process then runs as many
    forwards as the process with the most batches, the extra ones on a one-token row whose score is dropped (a
    process with nothing to score runs only those), and the model is resharded after them."""
    rm.eval()
    device = next(rm.parameters()).device
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    scores = torch.zeros(len(ids), len(rm.head_names))
    batches = -(-len(order) // batch_size)
    sharded = is_sharded(rm)
    if sharded:  # the count first, on every process, before any forward's own collectives
        most = torch.tensor([batches], device=device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = pad_sequences([ids[i] for i in chunk], pad_id)
        scores[chunk] = rm(batch["input_ids"].to(device), batch["attention_mask"].to(device)).float().cpu()
    if sharded:
        one = torch.ones(1, 1, dtype=torch.long, device=device)
        for _ in range(int(most) - batches):
            rm(one * pad_id, one)
        reshard(rm)
    return scores


class RewardScorer:
    """A trained reward model used as a reward: per-head scores, optionally normalised, combined with weights.

    reward(x, y) = Σ_h w_h · ŝ_h(x, y),  ŝ_h = (s_h − mean_h) / std_h when normalising (statistics from
    reward_normalization.json; their absence is an error), else s_h. Weights default to 1 for the first head
    and 0 for the others.
    """

    def __init__(
        self,
        path: str | Path,
        weights: dict[str, float] | None = None,
        normalize: bool = True,
        device: str | torch.device = "cpu",
        max_length: int = 1024,
        dtype: str = "float32",
    ):
        from tether.models.lm import load_tokenizer

        self.tokenizer = load_tokenizer(path)
        self.model = load_reward_model(path, self.tokenizer, dtype=dtype).to(device).eval()
        # a vision-language reward model scores (prompt, images, response): score_rows, with its own processor
        self.processor = load_processor(path, self.tokenizer) if is_vision_language(path) else None
        names = self.model.head_names
        weights = dict(weights) if weights else {names[0]: 1.0}
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ConfigError(f"reward weights name heads {unknown}; the model at {path} has heads {names}")
        self.weights = torch.tensor([float(weights.get(n, 0.0)) for n in names])
        self.mean, self.std = torch.zeros(len(names)), torch.ones(len(names))
        if normalize:
            stats = load_normalization(path)
            self.mean = torch.tensor([stats[n]["mean"] for n in names])
            self.std = torch.tensor([stats[n]["std"] for n in names])
        self.max_length = max_length

    def head_scores(self, texts: list[str]) -> torch.Tensor:
        """(N, heads) normalised (or raw) scores of full rendered texts."""
        raw = score_texts(self.model, self.tokenizer, texts, max_length=self.max_length)
        return (raw - self.mean) / self.std

    def __call__(self, texts: list[str]) -> list[float]:
        return (self.head_scores(texts) @ self.weights).tolist()

    @property
    def reads_images(self) -> bool:
        return self.processor is not None

    @torch.no_grad()
    def score_encoded(self, encoded: list[tuple[list[int], dict | None]], batch_size: int = 16) -> list[float]:
        """A vision-language reward model's rewards of encoded (prompt, images, response) rows: (token ids, pixel
        tensors or None) each, as data/preferences.py encode_scored makes them (rewards/score.py)."""
        from tether.models.vision import join_vision, on_model

        check_lengths([ids for ids, _ in encoded], self.max_length)
        raw = torch.zeros(len(encoded), len(self.model.head_names))
        device = next(self.model.parameters()).device
        for start in range(0, len(encoded), batch_size):
            part = encoded[start : start + batch_size]
            batch = pad_sequences([ids for ids, _ in part], self.tokenizer.pad_token_id)
            vision = on_model(self.model, join_vision([v for _, v in part], batch["input_ids"].shape[1]))
            scores = self.model(batch["input_ids"].to(device), batch["attention_mask"].to(device), **vision)
            raw[start : start + len(part)] = scores.float().cpu()
        return (((raw - self.mean) / self.std) @ self.weights).tolist()

    @property
    def in_step(self) -> bool:
        """Sharded (--fsdp, tether/train/sharding.py shard_reward_model): every process must score in step, even
        one with no texts (rewards/score.py Scorer.join_idle)."""
        return is_sharded(self.model)


def process_reward_separator(path: str | Path) -> str:
    """The step separator a `tether prm` folder was trained with (config.json's tether_step_separator), read before
    any weight loads. A folder without the 'step' head is refused naming what it is: a causal LM would get a new
    zero head (every step scored ½), an outcome reward model scores whole texts, not steps."""
    path = check_dir(path, "model")
    check_model_folder(path, "model")
    config = json.loads((path / "config.json").read_text())
    what, heads = f"--process-reward-model {path}", list((config.get("id2label") or {}).values())
    architectures = config.get("architectures") or ["no architecture named"]
    if VISION_HEADS_KEY in config:  # a vision-language reward model: tether's head, named in config.json
        heads = list(config[VISION_HEADS_KEY])
    elif not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ConfigError(
            f"{what} is a language model ({', '.join(architectures)}), not a process reward model: it has no "
            f"'{STEP_HEAD}' head, and a new one would score every step 0.5. Train one with `tether prm`"
        )
    if heads != [STEP_HEAD]:
        kind = "an outcome reward model (`tether rm`)" if (path / NORM_FILE).is_file() else "a classifier"
        raise ConfigError(
            f"{what} is {kind} with heads {heads}, not a process reward model: `tether prm` writes one head, "
            f"'{STEP_HEAD}', read at each step's last token"
        )
    separator = config.get(STEP_SEPARATOR_KEY)
    if not isinstance(separator, str) or not separator:
        raise ConfigError(
            f"{what} has the '{STEP_HEAD}' head but no {STEP_SEPARATOR_KEY} in its config.json: the separator that "
            "followed each step in training, which says where a step matched by --step-pattern is read. Add it "
            '(e.g. "tether_step_separator": "\\n") or train the model again with `tether prm`'
        )
    return separator


class ProcessRewardScorer:
    """A trained process reward model (`tether prm`) used as a reward: for each text and each step's end (a
    character offset: where the step's own text ends, before the separator ``step_separator`` that followed it in
    training; tether/data/steps.py trained_step_end), p_k = σ(s_k), the head's probability that the step is right,
    read at the token holding the step's last character (docs/algorithms.md §2.4)."""

    def __init__(
        self, path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32", batch_size: int = 16
    ):
        from tether.models.lm import load_tokenizer

        self.step_separator = process_reward_separator(path)
        self.tokenizer = load_tokenizer(path)
        self.model = load_reward_model(path, self.tokenizer, dtype=dtype).to(device).eval()
        self.device, self.batch_size = device, batch_size
        # a vision-language process reward model reads each text with its prompt's images (its own processor)
        self.processor = load_processor(path, self.tokenizer) if is_vision_language(path) else None

    @property
    def reads_images(self) -> bool:
        return self.processor is not None

    def text_steps(self, text: str, char_ends: list[int]) -> tuple[list[int], list[int], bool]:
        """(token ids, the token holding each step's last character, whether special tokens were added)."""
        bos = self.tokenizer.bos_token or ""
        specials = not (bos and text.startswith(bos))  # a rendered chat prompt has its own
        enc = self.tokenizer(text, add_special_tokens=specials, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        # a special token the tokenizer adds (an EOS appended by its post-processor) holds no character: (0, 0)
        steps = [max(t for t, (s, e) in enumerate(offsets) if s < max(end, 1) and e > s) for end in char_ends]
        return enc["input_ids"], steps, specials

    def __call__(self, texts: list[str], char_ends: list[list[int]]) -> list[list[float]]:
        """Each text's step probabilities ([] for a text without steps)."""
        encoded = [self.text_steps(t, e)[:2] + (None,) if e else None for t, e in zip(texts, char_ends)]
        return self.score_encoded(encoded)

    @torch.no_grad()
    def score_encoded(self, encoded: list) -> list[list[float]]:
        """Step probabilities of encoded rows: (token ids, step tokens, a vision-language model's pixel tensors or
        None) each, or None for a row without steps ([])."""
        from tether.models.vision import join_vision, on_model

        out: list[list[float]] = [[] for _ in encoded]
        for start in range(0, len(encoded), self.batch_size):
            rows = [(i, *encoded[i]) for i in range(start, min(start + self.batch_size, len(encoded))) if encoded[i]]
            if not rows:
                continue
            batch = pad_sequences([ids for _, ids, _, _ in rows], self.tokenizer.pad_token_id)
            width = max(len(steps) for _, _, steps, _ in rows)
            index = torch.tensor([steps + [0] * (width - len(steps)) for _, _, steps, _ in rows])
            shown = [v for _, _, _, v in rows]
            vision = on_model(self.model, join_vision(shown, batch["input_ids"].shape[1])) if any(shown) else {}
            logits = self.model(
                batch["input_ids"].to(self.device),
                batch["attention_mask"].to(self.device),
                step_index=index.to(self.device),
                **vision,
            )[..., 0]
            for (i, _, steps, _), row in zip(rows, torch.sigmoid(logits).float().cpu()):
                out[i] = row[: len(steps)].tolist()
        return out
