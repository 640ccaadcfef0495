"""No function over MAX_LINES lines in the product's code (the issue's rule for the modules' size): a longer
one is named with its file and line. bench/ (the lead's) and tests/ are left out."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60
LEFT_OUT = {"bench", "tests"}


def product_files() -> list[Path]:
    """Every .py file of the repository but bench/, tests/ and hidden folders (.git, a virtual environment)."""
    return [path for path in sorted(ROOT.rglob("*.py"))
            if not any(part in LEFT_OUT or part.startswith(".") for part in path.relative_to(ROOT).parts[:-1])]


def long_functions(source: str, name: str) -> list[str]:
    """Each function (nested ones too) over MAX_LINES lines, decorators left out, as "file:line name (n lines)"."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                found.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_check_names_a_long_function():
    body = "".join(f"    x{line} = {line}\n" for line in range(MAX_LINES))
    assert long_functions(f"def long():\n{body}", "m.py") == ["m.py:1 long (61 lines)"]
    assert long_functions(f"def short():\n{body[:body.rindex('    x')]}", "m.py") == []


def test_no_function_is_over_60_lines():
    files = product_files()
    assert any(path.name == "app.py" for path in files) and not any("bench" in path.parts for path in files)
    found = [entry for path in files
             for entry in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, "functions over 60 lines: " + "; ".join(found)
