"""What crosses between the trainer and its rollout worker (rollout/async_worker.py), and between processes under
rollout_workers = one: rollouts as plain values (over the pipe) or JSON values (never pickle), a vision-language
request's pixel tensors as a safetensors file, and the parity probe that checks the worker holds the pushed weights."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tether.rollout.batch import Rollout

FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "truncated", "sampler_logprobs")


def to_wire(rollout: Rollout) -> dict:
    """A Rollout as plain values (numpy arrays, lists): what crosses the pipe, pickled by value."""
    out = {name: getattr(rollout, name).cpu().numpy() for name in FIELDS}
    out.update(prompts=list(rollout.prompts), responses=list(rollout.responses))
    return out


def to_json(rollout: Rollout) -> dict:
    """A Rollout's fields as JSON values (each tensor's dtype, shape and values; float32 values survive the trip
    exactly as Python floats): what process 0 hands the others under rollout_workers = one (never pickle)."""
    out: dict = {"prompts": list(rollout.prompts), "responses": list(rollout.responses)}
    for name in (*FIELDS, "policy_versions"):
        t = getattr(rollout, name)
        if t is not None:
            out[name] = [str(t.dtype).removeprefix("torch."), list(t.shape), t.flatten().tolist()]
    return out


def from_json(data: dict) -> Rollout:
    tensors = {
        name: torch.tensor(data[name][2], dtype=getattr(torch, data[name][0])).reshape(data[name][1])
        for name in (*FIELDS, "policy_versions")
        if name in data
    }
    return Rollout(**tensors, prompts=data["prompts"], responses=data["responses"])


def write_pixels(path: Path, vision: list[dict | None], images: list[list] | None = None) -> None:
    """Each row's pixel tensors (a vision-language prompt's, or None) in one safetensors file (tensors only), named
    ``<row>/<input>``: how a request's images reach the worker; with ``images`` (an engine that processes the images
    itself: vLLM) each row's RGB images too, as uint8 arrays ``<row>/image/<k>``. A group's rows share their prompt's
    tensors, which are written once, under the group's first row (the metadata maps every row with images to the
    row it reads)."""
    import json

    import numpy as np
    from safetensors.torch import save_file

    first: dict[int, int] = {}  # id of a row's tensors -> the first row holding them
    tensors, reads = {}, {}
    for row, v in enumerate(vision):
        if v is not None:
            reads[str(row)] = first.setdefault(id(v), row)
            if reads[str(row)] == row:
                tensors.update({f"{row}/{name}": t.contiguous() for name, t in v.items()})
                for k, image in enumerate(images[row] if images is not None else []):
                    tensors[f"{row}/image/{k}"] = torch.from_numpy(np.array(image.convert("RGB")))
    save_file(tensors, str(path), metadata={"reads": json.dumps(reads), "images": str(images is not None)})


def read_pixels(path: str | None, rows: int) -> tuple[list[dict | None] | None, list[list] | None]:
    """(the rows' pixel tensors, their images or None) that write_pixels wrote (the file removed once read), or
    (None, None)."""
    if path is None:
        return None, None
    import json

    from PIL import Image
    from safetensors import safe_open

    written: dict[int, dict] = {}
    pictures: dict[int, dict] = {}
    with safe_open(path, "pt") as f:
        reads, with_images = json.loads(f.metadata()["reads"]), f.metadata()["images"] == "True"
        for key in f.keys():
            row, name = key.split("/", 1)
            if name.startswith("image/"):
                image = Image.fromarray(f.get_tensor(key).numpy())  # height x width x 3 uint8: RGB
                pictures.setdefault(int(row), {})[int(name.split("/")[1])] = image
            else:
                written.setdefault(int(row), {})[name] = f.get_tensor(key)
    os.unlink(path)
    vision = [written[reads[str(row)]] if str(row) in reads else None for row in range(rows)]
    if not with_images:
        return vision, None
    shown = {row: [pictures.get(row, {})[k] for k in sorted(pictures.get(row, {}))] for row in written}
    return vision, [shown[reads[str(row)]] if str(row) in reads else [] for row in range(rows)]


def pixels_digest(vision: list[dict | None]) -> str:
    """A digest of the rows' pixel tensors: two prompts with the same token ids (an image's placeholders are the
    same tokens whatever the image) and other images are other requests."""
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    for v in vision:
        for name, t in sorted((v or {}).items()):
            digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            digest.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def from_wire(data: dict, version: int) -> Rollout:
    tensors = {name: torch.from_numpy(data[name]) for name in FIELDS}
    rows = tensors["response_ids"].shape[0]
    return Rollout(
        **tensors,
        prompts=data["prompts"],
        responses=data["responses"],
        policy_versions=torch.full((rows,), version, dtype=torch.long),
    )


# The parity probe: after every push the worker and the trainer each compute the log-probs of a fixed token sequence
# with the weights of that version, and the trainer compares them. Two forwards of the same weights on one machine
# differ only in their summation order (~1e-6 nats in float32, less in float64, bf16 copies are not probed: the probe
# runs on the weights the worker loaded); 1e-3 nats is a thousand times that, and a worker whose distribution is
# within 1e-3 nats of the trainer's on every probe token samples what the trainer would, whatever it holds.
PROBE_TOKENS = 32
PARITY_TOLERANCE = 1e-3


@torch.no_grad()
def probe_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(x_{t+1} | x_≤t) of the probe sequence ``ids`` under ``model``, in float64 (len(ids) − 1 values), with
    dropout off: the worker's copy samples in eval mode, and a trainer's policy in train mode (--keep-dropout) would
    otherwise differ from it by the dropout's noise, not by its weights."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    training = model.training
    model.eval()
    try:
        logits = model(input_ids=x).logits[0, :-1].double()
    finally:
        model.train(training)
    return logits.log_softmax(-1).gather(-1, x[0, 1:, None].long()).flatten().cpu()


def probe_ids(tokenizer, config) -> list[int]:
    """A fixed probe: the first PROBE_TOKENS ids the tokenizer does not reserve, within the model's vocabulary."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = int(getattr(config, "vocab_size", 0) or len(tokenizer))
    return [i for i in range(vocab) if i not in special][:PROBE_TOKENS]


def probe(sampler, model, ids: list[int]) -> torch.Tensor:
    """The parity probe's log-probs in the worker: a vLLM engine's own, its weights pushed first (so an engine
    that kept older weights is caught, not only the worker's copy), unless it serves another dtype than the trainer's
    (rollout.sampling_dtype: bf16 log-probs are 1e-2 nats off by rounding alone, and such a copy is not probed, as on
    the hf backend); else the log-probs of the worker's copy of the weights. A vision-language policy's engine keeps
    its image placeholders' share of each softmax, which the trainer's policy hides (models/vision.py): the engine's
    log-probs are renormalised without it, the share measured on the worker's copy (which hides nothing then) —
    log p(x) − log(1 − p(placeholders)), so a stale engine still differs by what its weights change."""
    if hasattr(sampler, "probe_logprobs") and sampler.sampling_dtype is None:
        engine = sampler.probe_logprobs(ids)
        hidden = list(getattr(sampler, "placeholders", []))
        if not hidden:
            return engine
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], device=next(model.parameters()).device)).logits[0, :-1]
            logits = logits.double().cpu()
        shown = logits.index_fill(-1, torch.tensor(hidden), float("-inf"))
        return engine + logits.logsumexp(-1) - shown.logsumexp(-1)
    return probe_logprobs(model, ids)
