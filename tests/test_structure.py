"""The shape the codebase keeps: no stage module imports another stage module, and no function in
tether/stages/ or tether/train/ is longer than 80 lines."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tether"


def test_no_stage_imports_another_stage():
    stages = {p.stem for p in (PACKAGE / "stages").glob("*.py")} - {"__init__"}
    for path in (PACKAGE / "stages").glob("*.py"):
        own = {path.stem, f"{path.stem}_config", f"{path.stem}_probes"}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tether.stages"):
                names = [node.module.split(".")[2]] if node.module.count(".") >= 2 else [a.name for a in node.names]
                for name in names:
                    assert name in own or name not in stages, f"{path.name} imports tether.stages.{name}"


def test_no_function_over_80_lines_in_stages_and_train():
    for folder in ("stages", "train"):
        for path in (PACKAGE / folder).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    assert length <= 80, f"{path.name}:{node.lineno} {node.name} has {length} lines"
