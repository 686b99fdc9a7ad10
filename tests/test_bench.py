"""`tether bench`: the FLOP counts by hand and the report's shape (times are measured, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.diagnostics import bench


def test_flops_of_each_phase_by_hand(monkeypatch):
    """A 1-layer Llama, hidden 32 (MLP 128), vocabulary 64, embedding tied to the output projection:
    matmul parameters = 4·32² (attention) + 3·32·128 (MLP) + 64·32 (output) = 4096 + 12288 + 2048 = 18432.
    Batch 2 × 8 tokens: forward 2·18432·16 + attention 2·2·8²·32·1·2 = 589824 + 16384; backward twice that;
    generate 3 tokens per row: 2·18432·6; one decode step: 2·18432·2."""
    monkeypatch.setitem(bench.SIZES, "tiny", (32, 1, 2, 64))
    model = bench.build_model("tiny", "fp32")
    assert bench.matmul_parameters(model) == 18432
    phases = {p.name: p for p in bench.phases(model, batch=2, length=8, new_tokens=3, repeats=1)}
    assert phases["forward"].flops == phases["logprob_forward"].flops == 589824 + 16384
    assert phases["backward"].flops == 2 * (589824 + 16384)
    assert phases["generate"].flops == 2 * 18432 * 6 and phases["decode_step"].flops == 2 * 18432 * 2
    assert {"optimizer (for-loop)", "optimizer (foreach)"} <= set(phases)
    assert all(p.seconds > 0 for p in phases.values() if "(" not in p.name or p.name.endswith(")"))


def test_the_command_prints_a_table_and_writes_json(monkeypatch, tmp_path, capsys, llama_dir, addition_files):
    from tether.cli import main

    monkeypatch.setitem(bench.SIZES, "tiny", (32, 1, 2, 64))
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--models",
                "tiny",
                "--precisions",
                "fp32,bf16",
                "--batch",
                "2",
                "--length",
                "8",
                "--new-tokens",
                "2",
                "--repeats",
                "1",
                "--matmul-size",
                "64",
                "--data",
                str(addition_files[0]),
                "--model",
                str(llama_dir),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert set(result["peak_gflops"]) == {"fp32", "bf16"} and all(v > 0 for v in result["peak_gflops"].values())
    assert [(r["model"], r["precision"]) for r in result["runs"]] == [("tiny", "fp32"), ("tiny", "bf16")]
    row = result["runs"][0]["phases"][0]
    assert row["phase"] == "forward" and row["share_of_peak"] == pytest.approx(
        row["gflops_per_s"] / result["peak_gflops"]["fp32"]
    )
    padding = result["padding"]
    assert padding["examples"] == 200 and 0 <= padding["padding_share"] < 1
    assert padding["positions"] >= padding["padding_free_positions"] >= padding["real_tokens"]
    assert "of the positions are padding" in capsys.readouterr().err


@pytest.mark.slow
def test_compile_phases_time_the_compilation_and_the_steady_step(monkeypatch):
    monkeypatch.setitem(bench.SIZES, "tiny", (32, 1, 2, 64))
    result = bench.run_bench(
        models=("tiny",),
        precisions=("fp32",),
        batch=2,
        length=8,
        new_tokens=2,
        repeats=1,
        matmul_size=64,
        compile_model=True,
    )
    rows = {
        r["phase"].split(" (")[0] + (" compiled" if "torch.compile" in r["phase"] else ""): r
        for r in result["runs"][0]["phases"]
    }
    assert rows["forward+backward compiled"]["seconds"] > 0
    first = next(r for r in result["runs"][0]["phases"] if r["phase"].startswith("compile, first call"))
    assert first["seconds"] > rows["forward+backward compiled"]["seconds"]  # the first call compiles


def test_a_model_torch_compile_cannot_compile_is_named_not_a_compiler_traceback(monkeypatch):
    """Inductor compiles C++ on this machine; where that fails (no compiler, mismatched ATen headers) --compile
    says so and how to go on."""
    import torch
    from torch._dynamo.exc import BackendCompilerFailed

    from tether.errors import ConfigError

    def fails(*args, **kwargs):
        raise BackendCompilerFailed("inductor", RuntimeError("C++ compile error: g++ not found"), None)

    monkeypatch.setattr(torch, "compile", lambda model: fails)
    monkeypatch.setitem(bench.SIZES, "tiny", (32, 1, 2, 64))
    with pytest.raises(
        ConfigError, match="torch.compile could not compile the model on this machine .*without --compile"
    ):
        bench.run_bench(
            models=("tiny",),
            precisions=("fp32",),
            batch=2,
            length=8,
            new_tokens=2,
            repeats=1,
            matmul_size=64,
            compile_model=True,
        )


def test_online_packing_rebuilds_a_runs_rollouts_and_counts_their_positions(tmp_path, llama_dir):
    """bench/online_packing.py: rollouts from samples.jsonl keep the run's lengths (EOS only where not truncated),
    and the position counts are the real tokens, the padded grid and the packed rows."""
    import importlib.util

    from tether.models.lm import load_tokenizer

    spec = importlib.util.spec_from_file_location(
        "online_packing", Path(__file__).parents[1] / "bench" / "online_packing.py"
    )
    online_packing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(online_packing)
    tok = load_tokenizer(llama_dir)
    samples = [
        {"step": 1, "prompt": "1+2=", "response": "3", "truncated": False},
        {"step": 1, "prompt": "10+20=", "response": "30 and more", "truncated": True},
        {"step": 2, "prompt": "4+4=", "response": "8", "truncated": False},
    ]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    rollouts = online_packing.rollouts_from_samples(tmp_path, tok, limit=1)
    assert len(rollouts) == 1
    r = rollouts[0]
    lengths = [len(tok(s["prompt"], add_special_tokens=False)["input_ids"]) for s in samples[:2]]
    answers = [
        len(tok(s["response"], add_special_tokens=False)["input_ids"]) + (not s["truncated"]) for s in samples[:2]
    ]
    assert r.prompt_mask.sum(-1).tolist() == lengths and r.response_mask.sum(-1).tolist() == answers
    assert r.prompt_mask[:, -1].tolist() == [1, 1] and r.response_mask[:, 0].tolist() == [1, 1]  # left / right padded
    assert r.response_ids[0, answers[0] - 1].item() == tok.eos_token_id
    assert r.truncated.tolist() == [False, True]
    real, padded, packed = online_packing.positions(r)
    assert real == sum(lengths) + sum(answers)
    assert padded == 2 * (max(lengths) + max(answers))
    assert real <= packed <= padded


def test_the_gpu_script_floors_by_hand_and_its_plumbing_on_a_cpu(tmp_path):
    """bench/gpu_phases.py, prepared for a lent GPU: each phase's floor at the device's limits, and one hf step of
    its tiny shape end to end on the CPU (the GPU run itself is in docs/performance.md's command)."""
    import importlib.util
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "bench" / "gpu_phases.py"
    spec = importlib.util.spec_from_file_location("gpu_phases", script)
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    # 8 decode steps of 4 rows: each max(2000 B / 1e3 B/s, 2·1000·4 / 1e6) = 2 s; a 100-position forward 2·1000·100 /
    # 1e6 = 0.2 s; forward and backward over 100 positions 6·1000·100 / 1e6 = 0.6 s
    step = {"rollout/length_mean": 8, "positions/reference": 100, "positions/update": 100}
    limits = {"peak_flops": 1e6, "hbm_bytes_per_s": 1e3}
    assert gpu.floors(step, 1000, 2000, limits, 4) == pytest.approx({"generate": 16, "logprobs": 0.2, "update": 0.6})
    assert gpu.floors(step, 1000, 2000, {}, 4) == {}  # a device of unknown limits: no floor claimed
    args = ["--shape", "tiny", "--device", "cpu", "--backends", "hf", "--steps", "1", "--prompts", "2", "--group", "2"]
    args += ["--new-tokens", "4", "--mixed-precision", "no", "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((tmp_path / "gpu_phases.json").read_text())["runs"]["hf"]
    assert run["summary"]["tokens_per_s"] > 0 and run["steps"][0]["forwards/update"] == 1
