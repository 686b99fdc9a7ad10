"""``python -m tether.compat``: write the generated migration tables into the docs."""

from pathlib import Path

from tether.compat.docs import docs_with_tables

root = Path(__file__).resolve().parents[2]
for path, text in docs_with_tables(root).items():
    (root / path).write_text(text)
    print(f"wrote the table in {path}")
print("(the table of TRL's other defaults: python -m tether.api)")
