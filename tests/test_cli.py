"""The command line: data check, and bad input reaching the user as one clear line, not a traceback."""
import subprocess
import sys

from tether.cli import main

from conftest import write_jsonl


def test_data_check_prints_counts_and_the_loss_mask(llama_dir, tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "What is 1 + 2?\n", "completion": "3."},
                                              {"prompt": "x", "completion": ""}])
    assert main(["data", "check", str(path), "--model", str(llama_dir)]) == 0
    err = capsys.readouterr().err
    assert "2 records (prompt/completion) -> 1 examples" in err
    assert "dropped: 1 empty completion" in err
    assert "What is 1 + 2?\n⟦3.<|im_end|>⟧" in err


def test_bad_data_exits_2_with_the_file_and_line(llama_dir, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": "b"\n')
    code = main(["sft", "--model", str(llama_dir), "--data", str(path), "--output", str(tmp_path / "o"),
                 "--report-to", "none"])
    err = capsys.readouterr().err
    assert code == 2
    assert "tether sft: error:" in err and "bad.jsonl:2: not valid JSON" in err
    assert "Traceback" not in err


def test_missing_required_option_is_named(tmp_path, capsys):
    assert main(["sft", "--data", "x.jsonl", "--output", str(tmp_path / "o")]) == 2
    assert "--model is required" in capsys.readouterr().err


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "tether", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "sft" in proc.stdout
