"""Error codes come from the one table: no `code` in the product is a bare string, and docs/api.md lists each.

The source is read with ast: a string literal where a code goes (a `code=` argument, the code's position in a
call of anything that takes a `code` parameter, a `code`/`default_code` assignment, a comparison with `.code`,
a `code` parameter's default) is a code spelt outside tts_core.errors.ErrorCode, free to drift from it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tts_core.errors import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
NOT_PRODUCT = {"tests", "bench"}
# Callables from libraries whose argument is a code a caller sees: pydantic's custom error type is the `code`
# of the validation error it becomes.
LIBRARY_CODE_POSITIONS = {"PydanticCustomError": 0}


def product_files() -> list[Path]:
    packages = [path.parent for path in ROOT.glob("*/__init__.py") if path.parent.name not in NOT_PRODUCT]
    return sorted([*ROOT.glob("*.py"), *(path for package in packages for path in package.rglob("*.py"))])


def _parameters(function: ast.FunctionDef) -> list[ast.arg]:
    positional = [*function.args.posonlyargs, *function.args.args]
    return positional[1:] if positional and positional[0].arg in ("self", "cls") else positional


def code_positions(trees: list[ast.Module]) -> dict[str, int]:
    """Each function or class (by name) that takes a `code` parameter -> the position of that parameter."""
    own: dict[str, int | None] = {}  # -1: an __init__ without a code; None: a class with no __init__ (inherits)
    bases: dict[str, list[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [base.id for base in node.bases if isinstance(base, ast.Name)]
                init = next((item for item in node.body if isinstance(item, ast.FunctionDef)
                             and item.name == "__init__"), None)
                own[node.name] = None if init is None else _code_index(init)
            elif isinstance(node, ast.FunctionDef) and node.name != "__init__" and _code_index(node) >= 0:
                own[node.name] = _code_index(node)

    def inherited(name: str) -> int | None:
        if (name in own and own[name] is not None) or name not in bases:
            return own.get(name)
        return next((found for base in bases[name] if (found := inherited(base)) is not None), None)

    found = {name: position for name in own if (position := inherited(name)) is not None and position >= 0}
    # A parameter that takes one of those classes (`kind: type[ChorusError]`) is called as the class is.
    found |= {parameter.arg: found[kind] for tree in trees for node in ast.walk(tree)
              if isinstance(node, ast.FunctionDef) for parameter in _parameters(node)
              if (kind := _class_of(parameter.annotation)) in found}
    return {**found, **LIBRARY_CODE_POSITIONS}


def _class_of(annotation: ast.expr | None) -> str | None:
    """X of a `type[X]` annotation."""
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name) \
            and annotation.value.id == "type" and isinstance(annotation.slice, ast.Name):
        return annotation.slice.id
    return None


def _code_index(function: ast.FunctionDef) -> int:
    names = [parameter.arg for parameter in _parameters(function)]
    return names.index("code") if "code" in names else -1


def _literals(node: ast.AST) -> list[ast.Constant]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [item for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]


def _called(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else \
        node.func.attr if isinstance(node.func, ast.Attribute) else None


def _is_code(target: ast.AST) -> bool:
    name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None
    return name in ("code", "default_code")


def _is_super_init(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Attribute) and node.func.attr == "__init__" \
        and isinstance(node.func.value, ast.Call) and _called(node.func.value) == "super"


def _bases(tree: ast.Module, call: ast.Call) -> list[str]:
    """The base classes of the class whose body holds call."""
    return next(([base.id for base in node.bases if isinstance(base, ast.Name)] for node in ast.walk(tree)
                 if isinstance(node, ast.ClassDef) and any(inner is call for inner in ast.walk(node))), [])


def literal_codes(tree: ast.Module, positions: dict[str, int]) -> list[ast.Constant]:
    """The string literals in one module that stand where a code goes."""
    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += [literal for keyword in node.keywords if keyword.arg == "code"
                      for literal in _literals(keyword.value)]
            position = positions.get(_called(node) or "")
            if _is_super_init(node):  # its own class's base's __init__
                position = next((positions[base] for base in _bases(tree, node) if base in positions), None)
            if position is not None and position < len(node.args):
                found += _literals(node.args[position])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    found += [literal for part, value in zip(target.elts, node.value.elts, strict=False)
                              if _is_code(part) for literal in _literals(value)]
                elif _is_code(target):
                    found += _literals(node.value)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_code(side) for side in sides):
                found += [literal for side in sides for literal in _literals(side)]
        elif isinstance(node, ast.FunctionDef):
            parameters = [*node.args.posonlyargs, *node.args.args]
            defaults = zip(parameters[len(parameters) - len(node.args.defaults):], node.args.defaults, strict=True)
            keyword_defaults = zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
            found += [literal for parameter, default in [*defaults, *keyword_defaults]
                      if parameter.arg == "code" and default is not None for literal in _literals(default)]
    return found


def test_no_code_is_a_string_literal():
    parsed = {path: ast.parse(path.read_text(), str(path)) for path in product_files()}
    positions = code_positions(list(parsed.values()))
    assert {"ChorusError", "InvalidRequest", "Overloaded", "QueueFull", "TextError"} <= positions.keys()
    literals = [f"{path.relative_to(ROOT)}:{literal.lineno}: {literal.value!r}"
                for path, tree in parsed.items() for literal in literal_codes(tree, positions)]
    assert not literals, "error codes spelt as strings (use tts_core.errors.ErrorCode):\n" + "\n".join(literals)


def test_the_scan_sees_every_way_a_code_is_written():
    source = '''
class Refusal(InvalidRequest):
    code = "class_attribute"
    def __init__(self, message, retry_after_s, code="parameter_default"):
        super().__init__(message, None, code)
refused = Refusal("no", 1, "positional")
InvalidRequest("no", "input", "positional_inherited")
SynthesisError("failed", code="keyword")
error.code = "attribute"
status, default_code = 400, "tuple_assignment"
if error.code in ("compared_in", "tuple"): pass
PydanticCustomError("pydantic_type", "message")
Refusal("not a code: its message", 1, ErrorCode.QUEUE_FULL)
class Busy(Overloaded):
    def __init__(self):
        super().__init__("busy", 5, "super_init")
def refuse(kind: type[ChorusError]):
    raise kind("no", None, "class_parameter")
'''
    tree = ast.parse(source)
    positions = code_positions([ast.parse(Path(ROOT, "tts_core/errors.py").read_text()), tree])
    assert sorted(literal.value for literal in literal_codes(tree, positions)) == sorted(
        ["class_attribute", "parameter_default", "positional", "positional_inherited", "keyword", "attribute",
         "tuple_assignment", "compared_in", "tuple", "pydantic_type", "super_init", "class_parameter"])


def test_docs_list_every_code():
    errors = (ROOT / "docs" / "api.md").read_text().split("\n## Errors\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)` \|", errors, re.MULTILINE)
    assert sorted(set(ErrorCode) - set(rows)) == [], "ErrorCode members missing from docs/api.md's table of codes"
    assert sorted(set(rows) - set(ErrorCode)) == [], "docs/api.md lists codes that are not ErrorCode members"
