"""Checkpoints hold tensors and JSON only: the training state round-trips exactly, resuming never unpickles (a
poisoned pickle planted in a checkpoint is never executed), and a damaged state file is named, not a traceback."""

import math
import pickle
import random

import numpy as np
import pytest
import torch

from tether.train.checkpoint import load_training_state, rng_state, save_checkpoint
from tether.train.state_io import StateFileError, load_state, save_state


class Payload:
    """Unpickling this object writes a marker file: the proof that a pickle was loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _trained_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    for _ in range(2):
        model(torch.randn(4, 3)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def test_state_round_trips_exactly(tmp_path):
    _, optimizer, scheduler = _trained_optimizer()
    random.seed(3)
    np.random.seed(4)
    tree = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "odd": {1: (float("nan"), -math.inf), "s": [None, True, "x"]},
    }
    save_state(tmp_path / "state", tree)
    back = load_state(tmp_path / "state")
    assert set(tmp_path.iterdir()) == {tmp_path / "state.safetensors", tmp_path / "state.json"}
    for k, v in optimizer.state_dict()["state"][0].items():
        assert torch.equal(back["optimizer"]["state"][0][k], v)
    assert back["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]  # betas stay a tuple
    assert back["scheduler"] == scheduler.state_dict()
    random.setstate(back["rng"]["python"])  # tuples and numpy arrays come back as the RNGs need them
    np.random.set_state(back["rng"]["numpy"])
    assert (random.random(), np.random.rand()) == (random.Random(3).random(), np.random.RandomState(4).rand())
    assert math.isnan(back["odd"][1][0]) and back["odd"][1][1] == -math.inf and back["odd"]["s"] == [None, True, "x"]
    with pytest.raises(TypeError, match="tensors, numbers and text only"):
        save_state(tmp_path / "bad", {"fn": print})


def test_state_is_written_in_place_and_shared_memory_is_copied(tmp_path, monkeypatch):
    """An optimizer state is written from its own memory (no second copy at save time, the peak of a run); tensors
    that share memory, which safetensors refuses, are copied, and every one reads back equal."""
    import tether.train.state_io as state_io

    base = torch.arange(12.0)
    owned = torch.randn(5)
    tree = {
        "owned": owned,
        "whole": base,
        "view": base[2:6],
        "again": base,
        "transposed": torch.ones(2, 3).t(),
        "empty": torch.zeros(0),
        "empty2": torch.zeros(0),
    }
    written, save_file = {}, state_io.save_file

    def capture(tensors, filename):
        written.update(tensors)
        return save_file(tensors, filename)

    monkeypatch.setattr(state_io, "save_file", capture)
    save_state(tmp_path / "state", tree)
    assert written["state.owned"].data_ptr() == owned.data_ptr()  # in place
    assert written["state.whole"].data_ptr() == base.data_ptr()
    assert written["state.view"].data_ptr() != base.data_ptr() + 2 * 4  # shares base's memory: copied
    assert written["state.again"].data_ptr() != base.data_ptr()
    back = load_state(tmp_path / "state")
    for name, value in tree.items():
        assert torch.equal(back[name], value), name


def test_resume_never_unpickles_and_names_a_damaged_file(llama_dir, tokenizer, tmp_path):
    from accelerate import Accelerator

    from tether.models.lm import load_model

    accelerator = Accelerator(cpu=True)
    model = load_model(llama_dir, tokenizer)
    _, optimizer, scheduler = _trained_optimizer()
    folder = save_checkpoint(accelerator, model, tokenizer, optimizer, scheduler, 2, tmp_path / "run", {"x": 1}, keep=0)
    assert not list(folder.glob("*.pt")) and (folder / "optimizer.safetensors").is_file()
    marker = tmp_path / "pwned"
    (folder / "optimizer.pt").write_bytes(pickle.dumps(Payload(marker)))  # a planted pickle is never read
    _, fresh, fresh_scheduler = _trained_optimizer()
    assert load_training_state(folder, fresh, fresh_scheduler, 0)["x"] == 1 and not marker.exists()
    (folder / "optimizer.json").unlink()  # a checkpoint with the pickle only (tether 0.1's layout): refused
    with pytest.raises(StateFileError, match="pickles .*cannot resume"):
        load_training_state(folder, fresh, fresh_scheduler, 0)
    assert not marker.exists()
    save_state(folder / "optimizer", optimizer.state_dict())
    (folder / "scheduler.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(StateFileError, match="scheduler.safetensors: not a readable safetensors file"):
        load_training_state(folder, fresh, fresh_scheduler, 0)


def test_a_saved_folder_has_the_umasks_file_modes(tmp_path):
    """safetensors writes model.safetensors as 0600; a saved folder's files get the mode the umask gives any new file
    (0644 under the usual 022), so another user of a shared model folder can read the weights."""
    import os

    from tether.train.checkpoint import write_atomically

    def save(folder):
        path = folder / "model.safetensors"
        path.write_bytes(b"x")
        path.chmod(0o600)

    old = os.umask(0o022)
    try:
        out = write_atomically(save, tmp_path / "final")
    finally:
        os.umask(old)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_a_run_folder_refuses_a_second_live_writer_and_takes_over_a_killed_runs_lock(
    llama_dir, addition_files, tmp_path, capsys
):
    """A run folder has one writer. A second run into a folder another live process holds is refused, naming that
    process; once that process is killed (SIGKILL: no clean-up ran, its lock still names it) the next run takes
    the folder over with a note, and a finished run leaves the lock empty (free, naming nobody)."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from tether.cli import main

    out = tmp_path / "run"
    hold = (
        "import sys, time\nfrom pathlib import Path\nfrom accelerate import Accelerator\n"
        "from tether.train.run import hold_run_folder\n"
        "hold_run_folder(Accelerator(cpu=True), Path(sys.argv[1]))\nprint('held', flush=True)\ntime.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    args = ["sft", "--model", str(llama_dir), "--data", str(addition_files[0]), "--max-steps", "1", "--output"]
    args += [str(out), "--report-to", "none", "--eval-every", "0", "--save-every", "0"]
    try:
        assert holder.stdout.readline() == "held\n"
        for again in (["--overwrite"], []):
            assert main(args + again) == 2
            err = capsys.readouterr().err
            assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
                f"tether sft: error: --output {out} is being written by another run (pid {holder.pid} on host "
                f"{socket.gethostname()}, started 20"
            ), err
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert main(args + ["--overwrite"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"taking over the lock of a run that ended without releasing it (pid {holder.pid} on host" in err, err
    assert (out / "final").is_dir() and (out / ".tether.lock").read_text() == ""
