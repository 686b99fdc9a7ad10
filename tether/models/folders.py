"""A model or tokenizer folder checked before transformers reads it: the folder, its config.json, its weights
(safetensors headers, a .bin the weights-only loader takes) and its tokenizer files; a config.json that transformers'
validation refuses. Every error names the folder and the file."""

from __future__ import annotations

import pickle  # noqa: S403 - for the exception type torch.load raises on a .bin it refuses; nothing is unpickled here
from pathlib import Path

import torch

from tether.config import ConfigError


def check_dir(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(
            f"{what} {path}: not a folder. tether loads local Hugging Face folders only "
            "(config.json, weights, tokenizer files); nothing is downloaded"
        )
    return path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_folder(path: Path, what: str = "model", weights: bool = True) -> None:
    """Before transformers reads a folder: its config.json parses, its weights are there and readable (safetensors
    headers checked, which catches a truncated file), and — for a tokenizer — its files are there. Errors name the
    folder and the file."""
    import json

    config = path / "config.json"
    if weights:
        if not config.is_file():
            raise ConfigError(f"{what} {path}: no config.json; expected a folder written by save_pretrained")
        try:
            json.loads(config.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise ConfigError(f"{what} {path}: config.json is not valid JSON ({err})") from None
        shards = sorted(path.glob("*.safetensors"))
        if not shards and not list(path.glob("*.bin")):
            raise ConfigError(
                f"{what} {path}: no weights (model.safetensors); the folder has "
                f"{sorted(p.name for p in path.iterdir())[:12]}"
            )
        from safetensors import safe_open

        for shard in shards:
            try:
                with safe_open(str(shard), "pt"):
                    pass
            except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
                raise ConfigError(f"{what} {path}: {shard.name} is not a readable safetensors file ({err})") from None
        if not shards:
            for weights_file in sorted(path.glob("*.bin")):
                _check_torch_weights(weights_file, f"{what} {path}")
    elif not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"tokenizer {path}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); pass --tokenizer "
            "with a folder that has them, or save the tokenizer next to the model"
        )


# torch.save's legacy (pre-1.6, not zip) format opens with this pickled magic number
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def _check_torch_weights(weights_file: Path, what: str) -> None:
    """A ``pytorch_model*.bin`` is torch.save's zip archive (its directory read) or the legacy format, and the
    weights-only loader takes it: transformers loads such files with ``torch.load(weights_only=True)``, which
    unpickles tensors and plain containers only, never arbitrary objects, and refuses a file holding anything else.
    The same load is tried here, memory-mapped (no tensor is read), so that every folder tether opens (--model,
    --reward-model, --process-reward-model, a critic) stops with the file named; tether itself writes safetensors."""
    import zipfile

    with weights_file.open("rb") as handle:
        legacy = handle.read(len(_LEGACY_TORCH_MAGIC)) == _LEGACY_TORCH_MAGIC
    if not legacy:
        try:
            with zipfile.ZipFile(weights_file) as archive:
                if not any(name.endswith("data.pkl") for name in archive.namelist()):
                    raise zipfile.BadZipFile("no data.pkl in the archive")
        except (zipfile.BadZipFile, OSError) as err:
            raise ConfigError(
                f"{what}: {weights_file.name} is not a readable PyTorch weights file ({err}); convert the "
                "model to safetensors (model.save_pretrained) or replace the file"
            ) from None
    try:
        torch.load(weights_file, map_location="cpu", weights_only=True, mmap=not legacy)
    except (RuntimeError, EOFError) as err:  # a damaged archive member: torch's stream reader
        raise ConfigError(
            f"{what}: {weights_file.name} is not a readable PyTorch weights file ({str(err)[:200]}); convert the "
            "model to safetensors (model.save_pretrained) or replace the file"
        ) from None
    except pickle.UnpicklingError as err:
        said = [line.split("error:", 1)[1] for line in str(err).splitlines() if "WeightsUnpickler error:" in line]
        reason = (said[0] if said else str(err)[:200]).strip().split(". ")[0]
        raise ConfigError(
            f"{what}: {weights_file.name} holds more than tensors, and the weights-only loader refuses it ({reason}); "
            "tether never unpickles arbitrary objects: save the model as safetensors (model.save_pretrained) "
            "where you trust the file, and use that folder"
        ) from None


def config_invalid(path: Path, err: Exception) -> ConfigError:
    """A config.json that parses but that transformers' validation refuses (a field of the wrong type, heads that do
    not divide the hidden size): the error names the file, not the loader that read it."""
    return ConfigError(f"{path / 'config.json'}: {type(err).__name__}: {str(err)[:400]}")
