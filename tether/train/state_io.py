"""Training state as tensors and JSON only — no pickle, so reading a checkpoint never runs code.

A state (an optimizer's or scheduler's state_dict, the RNG states) is a tree of dicts, lists, tuples, numbers,
strings, None, torch tensors and numpy arrays. ``save_state(path, tree)`` writes every tensor and array to
``<path>.safetensors`` under the position it has in the tree, and the tree itself to ``<path>.json`` with each
tensor replaced by a reference; ``load_state(path)`` rebuilds it. JSON keeps no tuples and no non-string keys,
so those are written as tagged objects: {"__tuple__": [...]}, {"__items__": [[key, value], ...]}.
Anything else in a state (a function, an arbitrary object) is an error when saving, not something to unpickle.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tether.data.records import DataError

TENSOR, ARRAY, TUPLE, ITEMS, FLOAT = "__tensor__", "__ndarray__", "__tuple__", "__items__", "__float__"


class StateFileError(DataError):
    """A state file is missing, unreadable or not what tether writes; the message names the file (the command line
    reports it like any bad input file, without a traceback)."""


def _tensor_to_write(value: torch.Tensor, storages: set) -> torch.Tensor:
    """``value`` as safetensors writes it: contiguous, on the CPU, sharing memory with no other tensor written.
    A tensor alone in its memory is written in place — save_file reads it by pointer and the save is synchronous —
    so a checkpoint does not hold a second copy of an optimizer's state (at 29 M parameters, 228 MB per model);
    only a tensor whose memory an earlier one already uses is copied, as safetensors refuses shared memory."""
    tensor = value.detach().cpu().contiguous()
    storage = tensor.untyped_storage()
    if storage.nbytes() and storage.data_ptr() not in storages:
        storages.add(storage.data_ptr())
        return tensor
    return tensor.clone()


def _encode(value, key: str, tensors: dict, storages: set):
    if isinstance(value, torch.Tensor):
        tensors[key] = _tensor_to_write(value, storages)
        return {TENSOR: key}
    if isinstance(value, np.ndarray):
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value)).clone()
        return {ARRAY: key, "dtype": str(value.dtype)}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _encode(v, f"{key}.{k}", tensors, storages) for k, v in value.items()}
        return {ITEMS: [[k, _encode(v, f"{key}.{i}", tensors, storages)] for i, (k, v) in enumerate(value.items())]}
    if isinstance(value, tuple):
        return {TUPLE: [_encode(v, f"{key}.{i}", tensors, storages) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{key}.{i}", tensors, storages) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT: repr(value)}  # nan, inf, -inf: not JSON
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"state entry {key!r} is a {type(value).__name__}; a checkpoint holds tensors, numbers and text only"
    )


def _decode(value, tensors: dict, where: str):
    if isinstance(value, list):
        return [_decode(v, tensors, where) for v in value]
    if not isinstance(value, dict):
        return value
    if TENSOR in value or ARRAY in value:
        name = value.get(TENSOR, value.get(ARRAY))
        if name not in tensors:
            raise StateFileError(f"{where}: tensor {name!r} is missing from the .safetensors file")
        return tensors[name] if TENSOR in value else tensors[name].numpy().astype(value["dtype"])
    if TUPLE in value:
        return tuple(_decode(v, tensors, where) for v in value[TUPLE])
    if ITEMS in value:
        return {k: _decode(v, tensors, where) for k, v in value[ITEMS]}
    if FLOAT in value:
        return float(value[FLOAT])
    return {k: _decode(v, tensors, where) for k, v in value.items()}


def save_state(path: str | Path, state) -> None:
    """Write ``state`` as <path>.safetensors + <path>.json (both written whole, then renamed into place)."""
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, "state", tensors, storages=set())  # storages: the memory of each tensor written so far
    for suffix, write in (
        (".safetensors", lambda tmp: save_file(tensors, str(tmp))),
        (".json", lambda tmp: tmp.write_text(json.dumps(tree))),
    ):
        tmp = path.with_name(path.name + suffix + ".tmp")
        write(tmp)
        tmp.replace(path.with_name(path.name + suffix))


def load_state(path: str | Path):
    """The tree ``save_state`` wrote at ``path``; a missing or corrupt file raises StateFileError naming it."""
    path = Path(path)
    tensor_file, tree_file = path.with_name(path.name + ".safetensors"), path.with_name(path.name + ".json")
    for f in (tensor_file, tree_file):
        if not f.is_file():
            raise StateFileError(f"{f}: missing")
    try:
        tensors = load_file(str(tensor_file))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
        raise StateFileError(f"{tensor_file}: not a readable safetensors file ({err})") from None
    try:
        tree = json.loads(tree_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise StateFileError(f"{tree_file}: not valid JSON ({err})") from None
    return _decode(tree, tensors, str(tree_file))
