"""Lines of each example in examples/ beside its TRL equivalent in benchmarks/trl_equivalents/,
counted the same way for both: `total` is every line of the file; `code` leaves out blank lines,
lines holding only a comment, and docstrings (module, class and function), so it counts what a
reader has to write. A line of code with a trailing comment is code.

    python benchmarks/count_lines.py        # prints a Markdown table
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ("custom_reward", "custom_env", "custom_advantage")


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by the docstrings of the module, its classes and its functions."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def count(path: Path) -> tuple[int, int]:
    """(total lines, code lines) of a Python file."""
    text = path.read_text()
    docs = docstring_lines(ast.parse(text))
    lines = text.splitlines()
    code = sum(1 for i, line in enumerate(lines, 1)
               if line.strip() and not line.strip().startswith("#") and i not in docs)
    return len(lines), code


def main() -> int:
    rows = ["| example | reinforge code | TRL 1.16 code | reinforge total | TRL 1.16 total |", "|---|---|---|---|---|"]
    for name in PAIRS:
        ours, trl = ROOT / "examples" / f"{name}.py", ROOT / "benchmarks" / "trl_equivalents" / f"{name}.py"
        (ours_total, ours_code), (trl_total, trl_code) = count(ours), count(trl)
        rows.append(f"| `{name}.py` | {ours_code} | {trl_code} | {ours_total} | {trl_total} |")
    print("\n".join(rows))
    print("\ncode: lines that are not blank, not only a comment and not part of a docstring; total: all lines.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
