"""The package's shape (docs/architecture.md): no import cycles, a declarative registry, state in one place.

1. No cycle among src/slimrl's modules, counting function-level imports too (a cycle dodged by importing inside a
   function is still a cycle). An edge is an import of a slimrl module by name (parent packages not counted: their
   `__init__` files import nothing eagerly). Nor among its folders (patches/, ops/, planning/, ...; a module at the
   package root is a node of its own): a folder that imports a folder which imports it back is one room, not two.
2. Every algorithm module is a plain `PATCHES` list of `Patch` objects, each in `registry.ALGORITHMS`; importing the
   registry imports no TRL.
3. Private state on models and configs lives in slimrl.state (one `_slimrl` attribute): no module writes another
   `_slimrl_*` attribute.
4. The page's module map names every module under src/slimrl (its path under slimrl/, `__init__.py` files included),
   each with a line on what it holds, and names no module that does not exist.
5. Loading walks down: no module under slimrl/models imports the front end (fast_model, fast_language_model, or the
   package root's lazy names), function-level imports included; the front end calls into models/, never the reverse.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "slimrl"
PAGE = SRC.parent / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """slimrl modules an import statement names (a `from X import name` also names X.name when it is a module)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = module if is_package else module.rsplit(".", 1)[0]
    for _ in range(max(node.level - 1, 0)):
        base = base.rsplit(".", 1)[0]
    target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
    submodules = {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known}
    reads_target = len(submodules) < len(node.names)  # some name is defined in `target` itself
    return submodules | ({target} if reads_target and target in known else set())


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        edges = set()
        for node in ast.walk(tree):
            edges |= _imported(node, name, path.name == "__init__.py", known)
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules, or None (iterative depth-first search)."""
    state = {}  # 1 = on the current path, 2 = done
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_import_cycle_among_slimrl_modules():
    graph = import_graph()
    assert len(graph) > 30 and graph["slimrl.patches.registry"], "the graph was not built"
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_cycle_detection_has_teeth():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def folder_graph(graph: dict[str, set[str]], folders: set[str]) -> dict[str, set[str]]:
    """The module graph with each module replaced by its folder under slimrl (slimrl.ops.chunking -> "ops"; a module
    at the package root stays itself); edges inside one folder dropped."""

    def node(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in folders else module

    folded: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            folded.setdefault(node(target), set())
        folded.setdefault(node(source), set()).update(node(t) for t in targets if node(t) != node(source))
    return folded


def test_no_import_cycle_among_folders():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    graph = folder_graph(import_graph(), folders)
    assert {"patches", "planning", "training", "ops", "models"} <= folders and "ops" in graph["patches"], graph
    assert find_cycle(graph) is None, f"folder import cycle: {' -> '.join(find_cycle(graph))}"


def test_folder_cycle_detection_has_teeth():
    modules = {
        "slimrl.patches.scoring.row_groups": {
            "slimrl.patches.setup.row_groups_rules",
            "slimrl.training.budget",
            "slimrl.state",
        },
        "slimrl.training.budget": {"slimrl.planning.plan"},
        "slimrl.planning.plan": {"slimrl.planning.levers", "slimrl.ops.row_groups"},
        "slimrl.planning.levers": {"slimrl.patches.setup.row_groups_rules"},  # the planted upward arrow
    }
    folders = {"patches", "training", "planning", "ops"}
    assert find_cycle(folder_graph(modules, folders)) == ["patches", "training", "planning", "patches"]
    modules["slimrl.planning.levers"] = {"slimrl.ops.row_groups"}
    assert find_cycle(folder_graph(modules, folders)) is None
    assert folder_graph(modules, folders)["patches"] == {"training", "slimrl.state"}


def test_every_algorithm_module_is_a_declarative_list():
    from slimrl.patches import registry
    from slimrl.patches.seams import Patch

    for algorithm, patches in registry.ALGORITHMS.items():
        module = sys.modules[f"slimrl.patches.trainers.{algorithm}"]
        assert module.PATCHES is patches and patches and all(isinstance(p, Patch) for p in patches), algorithm
        assert module.__doc__ and "TRL's own" in module.__doc__, f"{algorithm}: say what is patched and what is TRL's"


def test_registry_import_imports_no_trl():
    code = "import sys; import slimrl.patches.registry; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_slimrl_attributes_outside_state(path):
    text = path.read_text()
    assert not re.findall(r"\b_slimrl_[a-z]\w*", text), f"{path.name}: private state belongs in slimrl.state"


def module_map(text: str) -> dict[str, str]:
    """The modules the page's `modules` block names (first cell of a table row, its path under slimrl/) and what
    each holds (the second cell)."""
    match = re.search(r"<!-- modules -->(.*?)<!-- /modules -->", text, re.S)
    assert match, "docs/architecture.md has no <!-- modules --> block"
    rows = re.findall(r"^\|\s*`([\w/]+\.py)`\s*\|(.*)\|\s*$", match.group(1), re.M)
    named = [path for path, _ in rows]
    assert len(named) == len(set(named)), f"named twice: {sorted({p for p in named if named.count(p) > 1})}"
    return {path: what.strip() for path, what in rows}


def map_mismatch(modules: set[str], named: dict[str, str]) -> list[str]:
    """What the module map gets wrong: a module it does not name, a name that is no module, a row with no line."""
    return (
        [f"not on the page: {m}" for m in sorted(modules - set(named))]
        + [f"no such module: {m}" for m in sorted(set(named) - modules)]
        + [f"no line on what it holds: {m}" for m, what in sorted(named.items()) if len(what.split()) < 2]
    )


def test_the_module_map_names_every_module_and_only_modules():
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    named = module_map(PAGE.read_text())
    assert len(modules) > 100 and "models/offload.py" in modules, "the package was not found"
    assert map_mismatch(modules, named) == []


def test_module_map_check_has_teeth():
    page = "<!-- modules -->\n| `a.py` | what a holds |\n| `x/b.py` | what b holds |\n| `x/c.py` | |\n<!-- /modules -->"
    named = module_map(page)
    assert map_mismatch({"a.py", "x/b.py", "x/c.py"}, named) == ["no line on what it holds: x/c.py"]
    assert map_mismatch({"a.py", "x/b.py", "x/c.py", "x/new.py"}, named)[0] == "not on the page: x/new.py"
    assert map_mismatch({"x/b.py", "x/c.py"}, named)[0] == "no such module: a.py"
    with pytest.raises(AssertionError, match="named twice"):
        module_map(page.replace("x/b.py", "a.py"))
    # on the real page: a planted module it does not name, and a named module taken away
    modules, real = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}, module_map(PAGE.read_text())
    assert map_mismatch(modules | {"models/planted.py"}, real) == ["not on the page: models/planted.py"]
    assert map_mismatch(modules - {"models/offload.py"}, real) == ["no such module: models/offload.py"]


PATCH_ROOMS = ("trainers", "rollouts", "scoring", "setup")  # top to bottom: a room imports only the rooms below it
ROOM_IMPORT = re.compile(r"^\s*from\s+(?:\.\.|slimrl\.patches\.)(trainers|rollouts|scoring|setup)\b", re.M)


def upward_room_imports(sources: dict[str, str]) -> list[str]:
    """`room/module.py imports room2` for each import from a room to a room above it (function-level ones too)."""
    found = []
    for path, text in sorted(sources.items()):
        room = path.split("/")[0]
        for target in sorted(set(ROOM_IMPORT.findall(text))):
            if PATCH_ROOMS.index(target) < PATCH_ROOMS.index(room):
                found.append(f"{path} imports {target}")
    return found


def test_patch_rooms_import_downwards_only():
    patches = Path(__file__).parents[1] / "src" / "slimrl" / "patches"
    rooms = sorted(p.name for p in patches.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert rooms == sorted(PATCH_ROOMS)
    sources = {str(f.relative_to(patches)): f.read_text() for room in rooms for f in (patches / room).glob("*.py")}
    assert upward_room_imports(sources) == []
    assert len([f for f in patches.glob("*.py")]) <= 8  # the root: what every patch goes through


def test_upward_room_check_has_teeth():
    planted = {"setup/x.py": "from ..trainers.offline import OFFLINE\n", "scoring/y.py": "    from ..setup import a\n"}
    assert upward_room_imports(planted) == ["setup/x.py imports trainers"]


FRONT = ("slimrl.fast_model", "slimrl.fast_language_model", "slimrl")  # the package root's lazy names lead up there


def calls_back_to_the_front(sources: dict[str, str]) -> list[str]:
    """`module imports front` for each import from a slimrl.models module (function-level ones too) of the front end
    (slimrl.fast_model, slimrl.fast_language_model, or the package root, whose lazy names are theirs)."""
    known = set(_modules()) | set(sources)
    found = []
    for name, text in sorted(sources.items()):
        edges = set()
        for node in ast.walk(ast.parse(text)):
            edges |= _imported(node, name, any(k.startswith(f"{name}.") for k in known), known)
        found += [f"{name} imports {front}" for front in FRONT if front in edges]
    return found


def test_models_never_call_back_up_to_the_front_end():
    sources = {_module_name(p): p.read_text() for p in (PACKAGE / "models").rglob("*.py")}
    assert len(sources) > 15 and "slimrl.models.vision" in sources
    assert calls_back_to_the_front(sources) == []


def test_front_end_check_has_teeth():
    planted = {
        "slimrl.models.planted": "def load():\n    from ..fast_model import FastModel\n    return FastModel\n",
        "slimrl.models.lazy": "def load():\n    from slimrl import FastLanguageModel\n",
        "slimrl.models.direct": "import slimrl.fast_language_model\n",
        "slimrl.models.fine": "from . import loading\nfrom ..state import model_state\n",
    }
    assert calls_back_to_the_front(planted) == [
        "slimrl.models.direct imports slimrl.fast_language_model",
        "slimrl.models.lazy imports slimrl",
        "slimrl.models.planted imports slimrl.fast_model",
    ]
