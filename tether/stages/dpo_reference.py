"""Reference log-probabilities for preference data, computed once and cached next to the run.

The DPO family compares the policy with a frozen reference on fixed data, so
log π_ref(y) depends only on (data, reference weights, tokenizer) and the
precision it is scored in: it is computed in one no-grad pass before training,
with its own batch size, and saved under a key made of those fingerprints. A
later run (a resume, or a sweep over β pointing --reference-cache at one
folder) finds the file and skips the pass; anything that changes the numbers
changes the key.

Fingerprints: data = hash of every response's token ids and response mask;
tokenizer = hash of its serialised vocabulary/merges, chat template and
special tokens; reference = hash of config.json and the weight files (files
over 256 MiB: their size and first and last 16 MiB, to keep large models cheap);
scoring = the scoring weights' dtype and the autocast dtype (scoring_settings).
The prompt layout (padding-free, shared prompts) and the chunked head are not in
the key: they change the values only by rounding (on the tests' tiny model, in
fp32 and under bf16 autocast, not at all).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from tether.console import progress
from tether.data.dpo import PolicyPreference, collate_policy_preferences, data_fingerprint
from tether.models.packing import prompt_sharing_refusal, sequence_logprob_sums

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
BIG_FILE = 256 << 20
EDGE = 16 << 20


def model_fingerprint(path: str | Path) -> str:
    folder = Path(path)
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in folder.iterdir()
        if p.is_file()
        and (p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES)
        and not p.name.startswith(("optimizer", "scheduler", "rng-"))
    )
    if not files:
        raise FileNotFoundError(f"{folder}: no config.json or weight files to fingerprint")
    for p in files:
        size = p.stat().st_size
        digest.update(f"{p.name}:{size}".encode())
        with p.open("rb") as handle:
            if size <= BIG_FILE:
                digest.update(handle.read())
            else:
                digest.update(handle.read(EDGE))
                handle.seek(size - EDGE)
                digest.update(handle.read(EDGE))
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = [
        backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True),
        str(getattr(tokenizer, "chat_template", "") or ""),
        json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str),
    ]
    choice = getattr(tokenizer, "tether_chat", None)
    if choice is not None and (choice.template is not None or choice.kwargs):  # the run's template choice renders too
        parts.append(repr((choice.template, sorted(choice.kwargs.items()))))
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def scoring_settings(model_cfg, by_policy: bool) -> dict:
    """The settings besides weights, data and tokenizer that change the reference's log-probs, for the cache key:
    the dtype of the weights that score (the policy's --dtype when the policy scores — before training, or with LoRA
    its adapter disabled —, else the loaded reference's frozen dtype) and the autocast dtype (--mixed-precision).
    A dtype's two spellings (bf16, bfloat16) are one key. LoRA keys apart through the reference fingerprint."""
    from tether.models.lm import DTYPES, frozen_dtype

    dtype = model_cfg.dtype if by_policy else frozen_dtype(model_cfg)
    return {
        "dtype": str(DTYPES.get(dtype, dtype)),  # "auto": the checkpoint's own, which the reference fingerprint covers
        "mixed_precision": model_cfg.mixed_precision,
    }


def cache_key(examples: list[PolicyPreference], reference_fp: str, tokenizer_fp: str, scoring: dict) -> dict:
    parts = {
        "data": data_fingerprint(examples),
        "reference": reference_fp,
        "tokenizer": tokenizer_fp,
        "scoring": scoring,
        "examples": len(examples),
        "version": 2,  # 1 had no scoring settings: its fp32 values were found by bf16 runs
    }
    parts["key"] = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return parts


@torch.no_grad()
def sequence_logps(
    model,
    examples: list[PolicyPreference],
    pad_id: int,
    batch_size: int,
    device,
    padding_free: bool = True,
    share_prompt: bool = False,
    chunked_head: bool = False,
) -> list[list[float]]:
    """Σ log π(y|x) over each response's tokens, in the examples' order (best first within each)."""
    was_training = model.training
    model.eval()
    out: list[list[float]] = []
    for start in progress(
        range(0, len(examples), batch_size),
        -(-len(examples) // batch_size),
        "reference log-probs (batches)",
        min_items=20,
    ):
        chunk = examples[start : start + batch_size]
        batch = collate_policy_preferences(chunk, pad_id, padding_free, share_prompt)
        k = batch["list_mask"].shape[1]
        on_device = {key: v.to(device) for key, v in batch.items()}
        logp, _ = sequence_logprob_sums(model, on_device, k * len(chunk), chunked_head)
        per = logp.cpu().view(k, len(chunk)).T  # (B, K)
        out += [per[i, : len(e.responses)].tolist() for i, e in enumerate(chunk)]
    model.train(was_training)
    return out


class ReferenceCache:
    """One JSON file per key in ``folder``: reference-logps-<key>.json with the key's parts and the values (JSON
    keeps every float exactly; nothing is unpickled when a cache is read)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def path(self, key: dict) -> Path:
        return self.folder / f"reference-logps-{key['key'][:20]}.json"

    def load(self, key: dict) -> list[list[float]] | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            stored = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None  # a damaged file: recompute
        if (
            not isinstance(stored, dict)
            or stored.get("key") != key["key"]
            or len(stored.get("logps", [])) != key["examples"]
        ):
            return None  # a prefix collision or a damaged file: recompute
        return stored["logps"]

    def save(self, key: dict, logps: list[list[float]]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "key": key["key"],
                    "parts": {k: v for k, v in key.items() if k != "key"},
                    "logps": [[float(x) for x in row] for row in logps],
                }
            )
        )
        tmp.replace(path)
        return path


def attach_reference_logps(examples: list[PolicyPreference], logps: list[list[float]]) -> None:
    for ex, values in zip(examples, logps):
        ex.reference_logps = list(values)


class ReferenceLogps:
    """log π_ref for preference examples: from the cache, or computed with the reference — the --reference model,
    the policy itself before training (same weights), or with LoRA the adapter-disabled policy."""

    def __init__(
        self,
        model_cfg,
        cache_folder: str,
        batch_size: int,
        tokenizer,
        policy,
        device,
        fresh_policy: bool,
        padding_free: bool = True,
        share_prompt: bool = False,
        hide_placeholders: bool = False,
    ):
        self.model_cfg, self.batch_size, self.tokenizer, self.policy, self.device = (
            model_cfg,
            batch_size,
            tokenizer,
            policy,
            device,
        )
        self.padding_free = padding_free
        self.share_prompt = share_prompt  # the policy's layout; a reference loaded apart takes it where it can
        self.hide_placeholders = hide_placeholders  # a loaded reference gets the policy's placeholder hook
        self.lora = model_cfg.lora_r > 0 and not model_cfg.reference
        self.source = model_cfg.reference or model_cfg.path
        self.fingerprint = model_fingerprint(self.source) + (":adapter-disabled" if self.lora else "")
        self.fresh_policy = fresh_policy  # the policy still has the reference's weights (online: until round 2)
        self._model = None
        self.cache = ReferenceCache(cache_folder)
        self.tokenizer_fp = tokenizer_fingerprint(tokenizer)
        self.computed = 0  # examples scored (0 when everything came from the cache)

    @property
    def by_policy(self) -> bool:
        """The policy scores (LoRA's with its adapter disabled, or one still at the reference's weights); else a
        reference is loaded."""
        return self.lora or (self.fresh_policy and not self.model_cfg.reference)

    @property
    def scoring(self) -> dict:
        return scoring_settings(self.model_cfg, self.by_policy)

    def describe(self) -> str:
        return "the adapter-disabled policy" if self.lora else self.source

    def _score(self, examples):
        if self.lora:
            with self.policy.disable_adapter():
                return self._logps(self.policy, examples)
        if self.by_policy:
            return self._logps(self.policy, examples)
        if self._model is None:
            from tether.models.lm import load_reference

            self._model = load_reference(self.model_cfg, self.tokenizer, self.device)
            if self.model_cfg.chunked_head:
                from tether.models.checks import check_chunked_head

                check_chunked_head(self._model, self.source)
            if self.hide_placeholders:
                from tether.models.vision import never_sample_placeholders

                never_sample_placeholders(self._model)
        return self._logps(self._model, examples)

    def _logps(self, model, examples):
        share = self.share_prompt and not prompt_sharing_refusal(model)  # the same values either way, up to rounding
        pad = self.tokenizer.pad_token_id
        chunked = self.model_cfg.chunked_head
        return sequence_logps(model, examples, pad, self.batch_size, self.device, self.padding_free, share, chunked)

    def attach(self, examples, use_cache: bool = True) -> str:
        """Fill ex.reference_logps; returns where they came from (for the plan)."""
        if not examples:
            return "none"
        key = cache_key(examples, self.fingerprint, self.tokenizer_fp, self.scoring)
        cached = self.cache.load(key) if use_cache else None
        if cached is not None:
            attach_reference_logps(examples, cached)
            return f"cache {self.cache.path(key)}"
        logps = self._score(examples)
        self.computed += len(examples)
        attach_reference_logps(examples, logps)
        if use_cache:
            self.cache.save(key, logps)
            return f"computed, cached in {self.cache.path(key)}"
        return "computed"
