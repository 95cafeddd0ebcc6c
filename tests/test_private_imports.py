"""No slimrl module reaches into another's private names.

A name that starts with one underscore belongs to its module: another module that needs it gets a public name in the
owner instead. Caught: `from slimrl.x import _name`, `from .x import _name`, and `module._name` where `module` was
imported from slimrl (`from . import loading` then `loading._helper()`). Other libraries' private names (TRL's) are
out of scope here; a patch names what it replaces in its docstring.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "slimrl"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _target(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module if is_package else module.rsplit(".", 1)[0]
    for _ in range(node.level - 1):
        base = base.rsplit(".", 1)[0]
    return f"{base}.{node.module}" if node.module else base


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None


def private_imports(source: str, module: str, is_package: bool, known: set[str]) -> list[str]:
    """Each cross-module use of a private slimrl name in `source`, as 'line N: what'."""
    tree = ast.parse(source)
    aliases, found = {}, []  # local name -> the slimrl module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "slimrl":
                    aliases[a.asname] = a.name if a.asname else aliases.setdefault("slimrl", "slimrl")
        elif isinstance(node, ast.ImportFrom):
            target = _target(node, module, is_package)
            if target.split(".")[0] != "slimrl":
                continue
            for a in node.names:
                if f"{target}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
                elif _private(a.name):
                    found.append(f"line {node.lineno}: from {target} import {a.name}")
    aliases.pop(None, None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and (owner := _dotted(node.value)):
            head, _, rest = owner.partition(".")
            resolved = ".".join(filter(None, (aliases.get(head), rest))) if head in aliases else None
            if resolved in known and resolved != module:
                found.append(f"line {node.lineno}: {resolved}.{node.attr}")
    return found


def _known() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_no_private_name_crosses_a_module_boundary():
    modules = _known()
    assert len(modules) > 100, "the package was not found"
    found = [
        f"{name}: {hit}"
        for name, path in sorted(modules.items())
        for hit in private_imports(path.read_text(), name, path.name == "__init__.py", set(modules))
    ]
    assert found == [], "private names used across modules (give them a public name in their owner):\n" + "\n".join(
        found
    )


def test_the_scan_flags_planted_private_imports():
    known = {"slimrl", "slimrl.ops", "slimrl.ops.lean_logprob", "slimrl.models", "slimrl.models.loading"}
    planted = (
        "from .lean_logprob import _accumulate, transform_logits_\n"
        "from slimrl.models.loading import _TOKENIZER_KWARGS\n"
        "from ..models import loading\n"
        "import slimrl.models.loading as ld\n"
        "import slimrl.ops.lean_logprob\n"
        "from trl.kernels.chunked_logprob import _use_triton\n"
        "def f(x):\n"
        "    self._cache = loading._target_device_type(x)\n"
        "    return ld._from_pretrained, slimrl.ops.lean_logprob._grads_out, loading.__name__, x._private\n"
    )
    found = private_imports(planted, "slimrl.ops.chunked_divergence", False, known)
    assert found == [
        "line 1: from slimrl.ops.lean_logprob import _accumulate",
        "line 2: from slimrl.models.loading import _TOKENIZER_KWARGS",
        "line 8: slimrl.models.loading._target_device_type",
        "line 9: slimrl.models.loading._from_pretrained",
        "line 9: slimrl.ops.lean_logprob._grads_out",
    ]
    clean = "from .lean_logprob import accumulate_grads\nfrom . import lean_logprob\nlean_logprob.rowdot\n"
    assert private_imports(clean, "slimrl.ops.chunked_divergence", False, known) == []
