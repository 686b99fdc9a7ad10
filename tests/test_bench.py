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
    """Where inductor compiles (any kernel path but torch's scalar one): the first call, compilation included, is
    slower than the steady compiled step. On the scalar path (ATEN_CPU_CAPABILITY=default), where torch 2.13's
    inductor cannot compile, --compile is refused in one line before anything is compiled."""
    from tether.errors import ConfigError
    from tether.models.lm import inductor_compiles_here

    monkeypatch.setitem(bench.SIZES, "tiny", (32, 1, 2, 64))
    settings = dict(models=("tiny",), precisions=("fp32",), batch=2, length=8, new_tokens=2, repeats=1, matmul_size=64)
    if not inductor_compiles_here():
        with pytest.raises(ConfigError, match=r"scalar kernel path \(ATEN_CPU_CAPABILITY=default\)"):
            bench.run_bench(**settings, compile_model=True)
        return
    result = bench.run_bench(**settings, compile_model=True)
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
    monkeypatch.setattr("tether.models.lm.inductor_compiles_here", lambda: True)  # past the scalar path's refusal
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


def _bench_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).parents[1] / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vs_trl_hands_both_sides_the_same_settings_and_the_same_data_order(tmp_path):
    """bench/vs_trl.py: tether's command line (parsed by tether's own parser and config) and the TRL driver's
    agree on steps, learning rate, batch, micro-batch, length, group size, budget and precision for every workload;
    the TRL files hold the lab's rows in tether's visiting order (EpochOrder), in TRL's column layout."""
    from tether.cli import build_parser
    from tether.config import config_from_args
    from tether.stages.dpo_config import DPOConfig
    from tether.stages.grpo_config import GRPOConfig
    from tether.stages.rm_config import RMConfig
    from tether.stages.sft_config import SFTConfig
    from tether.train.offline import EpochOrder

    vs_trl, driver = _bench_script("vs_trl"), _bench_script("trl_driver")
    world = tmp_path / "world"
    world.mkdir()
    turns = lambda i: [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    rows = {
        "sft": [{"messages": turns(i)} for i in range(7)],
        "prefs": [
            {"prompt": turns(i)[:1], "chosen": turns(i)[1:], "rejected": turns(i + 1)[1:], "topic": "t"}
            for i in range(7)
        ],
        "arith_rl": [{"prompt": turns(i)[:1], "question": f"q{i}", "answer": i} for i in range(7)],
    }
    for name, lines in rows.items():
        (world / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    files = vs_trl.trl_files(world, tmp_path / "trl", seed=3)
    order = EpochOrder(7, 3).slice(0, 7)
    read = lambda name: [json.loads(line) for line in files[name].read_text().splitlines()]
    assert order != list(range(7))  # the check below would hold for an unshuffled copy only by accident
    assert read("sft") == [{"prompt": turns(i)[:1], "completion": turns(i)[1:]} for i in order]
    assert read("prefs") == [{k: rows["prefs"][i][k] for k in ("prompt", "chosen", "rejected")} for i in order]
    assert read("arith_rl") == [rows["arith_rl"][i] for i in order]

    configs = {"sft": SFTConfig, "dpo": DPOConfig, "rm": RMConfig, "grpo": GRPOConfig, "rloo": GRPOConfig}
    for name, settings in vs_trl.WORKLOADS.items():
        for bf16 in (False, True):
            cfg = config_from_args(
                configs[name],
                build_parser().parse_args(
                    vs_trl.tether_args(name, settings, world, tmp_path / "m", tmp_path / "t", 5, bf16)
                ),
            )
            trl = driver.build_parser().parse_args(
                vs_trl.trl_args(name, settings, files, tmp_path / "m", tmp_path / "o", 5, bf16)
            )
            assert (trl.workload, trl.steps, cfg.train.max_steps) == (name, 5, 5)
            assert trl.lr == cfg.optim.lr and cfg.optim.lr_schedule == "constant" and cfg.optim.weight_decay == 0
            assert trl.bf16 == bf16 and cfg.model.mixed_precision == ("bf16" if bf16 else "no")
            if name in vs_trl.ONLINE:
                assert (trl.prompts_per_step, trl.group_size, trl.max_new_tokens, trl.micro) == (
                    cfg.rollout.prompts_per_step,
                    cfg.rollout.group_size,
                    cfg.rollout.max_new_tokens,
                    cfg.algo.micro_batch_size,
                )
                assert cfg.algo.recipe == name and cfg.algo.kl_coef == (0.04 if name == "grpo" else 0.0)
            else:
                assert (trl.batch, trl.micro, trl.max_length) == (
                    cfg.train.batch_size,
                    cfg.train.micro_batch_size,
                    cfg.data.max_length,
                )
                assert Path(trl.data) == files[settings["data"]] and cfg.data.eval_fraction == 0


def _lab_folder(folder: Path, stages: dict, lessons: list, wall: float) -> Path:
    """A lab folder as `tether lab` leaves it: each stage's stage.json (its result and recipe hash) and summary.json
    (the stages' seconds, the lessons, the wall time)."""
    for name, (result, seconds) in stages.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "stage.json").write_text(json.dumps({"recipe_hash": name, "result": result}))
    seconds = {name: s for name, (_, s) in stages.items()}
    summary = {"seconds": seconds, "lessons": lessons, "stages_wall_seconds": wall}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_compare_labs_finds_each_changed_figure_and_sets_two_labs_side_by_side(tmp_path, capsys):
    """bench/compare_labs.py: timings never count as a difference (5 figures: sft 1, ppo_kl0 2, ppo_kl0.2 1, eval
    1), one changed figure does (exit 1); --lessons puts the verdicts side by side and sums the stages of a kind
    (ratios by hand: 12/10, 4/4, (22+6)/(20+5) = 1.12)."""
    compare = _bench_script("compare_labs")
    lesson = lambda holds, figure: {"name": "kl_rope", "holds": holds, "evidence": f"win rate {figure}"}
    stages = lambda sft, ppo0, ppo2: {  # (result, seconds) by stage; "seconds" in a result is a timing too
        "sft": ({"eval": {"loss": 0.5}, "seconds": sft}, sft),
        "ppo_kl0": ({"gold": [1.0, 2.0]}, ppo0),
        "ppo_kl0.2": ({"gold": [1.0]}, ppo2),
        "eval": ({"accuracy": 0.5}, 4.0),
    }
    old = _lab_folder(tmp_path / "old", stages(10.0, 20.0, 5.0), [lesson(True, 0.83)], 40.0)
    same = _lab_folder(tmp_path / "same", stages(12.0, 22.0, 6.0), [lesson(False, 0.41)], 44.0)
    assert compare.main(old, same) == 0
    assert "5 figures, 0 differ" in capsys.readouterr().out
    changed = json.loads((same / "ppo_kl0" / "stage.json").read_text())
    changed["result"]["gold"][1] = 2.5
    (same / "ppo_kl0" / "stage.json").write_text(json.dumps(changed))
    assert compare.main(old, same) == 1
    assert "gold[1]: 2.0 -> 2.5" in capsys.readouterr().out
    assert compare.lessons(old, same) == 1  # a lesson that no longer holds
    out = capsys.readouterr().out
    assert "kl_rope: holds -> FAILS\n    win rate 0.83\n    win rate 0.41" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["sft"] == ["10.0", "12.0", "1.20"] and rows["eval"] == ["4.0", "4.0", "1.00"]
    assert rows["ppo"] == ["25.0", "28.0", "1.12"]  # ppo_kl0 and ppo_kl0.2 summed
    assert out.rstrip().endswith("40.0     44.0   1.10")


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--precisions", "fp16", "precisions: fp16 is not one of fp32, bf16"),
        ("--precisions", "fp32,", "precisions: '' is not one of fp32, bf16"),
        ("--models", "7b", "models: 7b is not one of lab, 29m"),
        ("--models", "lab,7b,1b", "models: 7b, 1b are not one of lab, 29m"),
    ],
)
def test_unknown_model_sizes_and_precisions_are_named_with_the_allowed_ones(flag, value, said, capsys):
    """They were a KeyError from inside the benchmark, after the matmul peak had been timed."""
    from tether.cli import main

    assert main(["bench", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"tether bench: error: command line: bench section: {said}\n" == err
