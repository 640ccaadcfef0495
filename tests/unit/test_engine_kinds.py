"""Engine kinds and strategies are named only where they live: outside tts_core/engines and tts_core/scheduler no
product code compares a string with a kind's name (what a registry entry writes as `engine:`) or a strategy's (a
shape's), so a new kind or strategy is added where it lives and nothing else has to learn its name."""

from __future__ import annotations

import ast
from pathlib import Path

from tts_core.engines.contract import Shape
from tts_core.engines.kinds import KINDS

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["app.py", "tts_core", "api", "ui", "admin", "jobs", "storage", "clones", "deploy"]
OWNERS = [ROOT / "tts_core" / "engines", ROOT / "tts_core" / "scheduler"]  # where the names live
NAMES = set(KINDS) | {shape.value for shape in Shape}


def product_files() -> list[Path]:
    files = [path for entry in PRODUCT for path in
             ([ROOT / entry] if entry.endswith(".py") else sorted((ROOT / entry).rglob("*.py")))]
    return [path for path in files if not any(owner in path.parents for owner in OWNERS)]


def named(node: ast.AST) -> set[str]:
    """The kind or strategy names a comparison's operand is, or holds (`x in ("kokoro", "vits")`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(named(element) for element in node.elts))
    return set()


def comparisons_naming_a_kind(source: str) -> list[tuple[int, set[str]]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = set().union(*(named(operand) for operand in [node.left, *node.comparators]))
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            names = named(node.pattern.value)
        else:
            continue
        if names:
            found.append((node.lineno if hasattr(node, "lineno") else node.pattern.lineno, names))
    return found


def test_the_names_are_known():
    assert {"piper", "vits", "pocket_tts", "vibevoice", "kokoro", "upstream", "one-shot", "stepped"} <= NAMES


def test_no_product_module_outside_the_engines_and_the_scheduler_compares_a_kind_or_strategy_name():
    found = [f"{path.relative_to(ROOT)}:{line}: {sorted(names)}" for path in product_files()
             for line, names in comparisons_naming_a_kind(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_scan_finds_such_a_comparison():
    source = 'if policy["name"] == "upstream":\n    pass\nok = kind in ("kokoro", "vits")\nfine = name == "joe"\n'
    assert comparisons_naming_a_kind(source) == [(1, {"upstream"}), (3, {"kokoro", "vits"})]
