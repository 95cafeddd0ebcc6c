"""Every change slimrl makes to an object it does not own goes through slimrl.swaps (docs/architecture.md), and
`slimrl.describe` lists them with the registry's class-level patches.

1. A scan of src/slimrl finds no direct change outside slimrl.swaps, slimrl.state and the registry: no `setattr` /
   `delattr` / `object.__setattr__`, no `__dict__[...]` write, no method (a `types.MethodType`, a lambda, a function
   of the module) assigned to an attribute, no write to a TRL config's field (`args.x = ...`,
   `training_args.x = ...`); the allow-list below names each exception and why.
   Nor a `global` statement, a `contextvars.ContextVar` or a ContextVar's `.set(` / `.reset(` outside slimrl.swaps:
   every module-level value slimrl writes at run time is a swaps.RunValue / ProcessValue, listed by run_values().
2. swap / restore nest and undo exactly; adjust_default changes a default only where the user did not set it.
3. describe() on a patched GRPO trainer lists class patches, the fused head swapped on the model and the config's
   slimrl fields.
"""

import ast
import types
from pathlib import Path

import pytest

from slimrl import swaps
from slimrl.state import config_state

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "slimrl"
OWNERS = {"swaps.py", "state.py", "patches/registry.py"}  # the modules whose job these writes are
CONFIG_NAMES = {"args", "training_args"}  # what slimrl calls a TRL config everywhere
ALLOWED = {
    ("training/oom.py", "setattr(trainer, name, value)"): "an out-of-memory stop puts back the trainer's rollout "
    "attributes as the step found them, inside the registry's training_step patch",
    ("ppo/value.py", "object.__setattr__(self, 'peft_model', peft_model)"): "slimrl's own module (not registered as "
    "a submodule)",
    ("models/teacher.py", "object.__setattr__(self, 'peft_model', peft_model)"): "slimrl's own module",
    ("models/teacher.py", "object.__setattr__(self, 'teacher', teacher)"): "slimrl's own module",
    ("export/merged.py", "delattr(config, attr)"): "slimrl's own deep copy of the config, for the exported files",
    ("models/embedded.py", "delattr(model.config, attr)"): "the model slimrl loads to convert the embedded GGUF",
    ("ops/logprob.py", "setattr(_fused_forward, HEAD_MARK, settings)"): "the fused head's settings, on slimrl's "
    "own forward function",
    (
        "patches/scoring/padding_free.py",
        "setattr(out, name, _grid(value, first, width - 1))",
    ): "the output of slimrl's own trimmed forward call, put back on the full column grid",
    ("patches/scoring/row_groups.py", "setattr(trainer, name, value)"): "a row group's scoring puts back the trainer's "
    "adaptive-entropy state as it found it, inside the registry's compute_loss patch",
}


def _is_method_value(value: ast.AST, functions: set[str]) -> bool:
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name):
        return value.id in functions
    func = value.func if isinstance(value, ast.Call) else None
    return isinstance(func, (ast.Attribute, ast.Name)) and getattr(func, "attr", getattr(func, "id", "")) == (
        "MethodType"
    )


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return node.targets if isinstance(node, ast.Delete) else []


def direct_changes(source: str) -> list[str]:
    """The lines of `source` that change a foreign object directly (module docstring, point 1)."""
    tree = ast.parse(source)
    functions = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("setattr", "delattr", "__setattr__", "__delattr__"):
                found.append(ast.unparse(node))
        for target in _targets(node):
            if isinstance(target, ast.Subscript) and getattr(target.value, "attr", None) == "__dict__":
                found.append(ast.unparse(node))
            elif isinstance(target, ast.Attribute):
                owner = target.value.id if isinstance(target.value, ast.Name) else None
                value = getattr(node, "value", None)
                if owner in CONFIG_NAMES or (value is not None and _is_method_value(value, functions)):
                    found.append(ast.unparse(node))
    return found


def run_time_globals(source: str) -> list[str]:
    """The lines of `source` that write a module-level value outside slimrl.swaps (module docstring, point 1)."""
    tree = ast.parse(source)
    found, context_vars = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and "ContextVar" in (
            getattr(node.func, "attr", None),
            getattr(node.func, "id", None),
        ):
            found.append(ast.unparse(node))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            if "ContextVar" in ast.unparse(node.value.func):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                context_vars |= {t.id for t in targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr in ("set", "reset") and isinstance(func.value, ast.Name):
            if func.value.id in context_vars:
                found.append(ast.unparse(node))
    return found


def test_no_run_time_global_outside_the_swap_module():
    found = [
        f"{path.relative_to(PACKAGE)}: {line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "swaps.py"
        for line in run_time_globals(path.read_text())
    ]
    assert found == [], "declare these as slimrl.swaps.RunValue / ProcessValue:\n" + "\n".join(found)


def test_the_global_scan_has_teeth():
    source = """
import contextvars
from contextvars import ContextVar
_x = 0
_var = contextvars.ContextVar("v", default=None)
_other: ContextVar = ContextVar("w")
def f():
    global _x
    _x = 1
    token = _var.set(2)
    _var.reset(token)
    settings.set(3)
"""
    assert sorted(run_time_globals(source)) == sorted(
        [
            "global _x",
            "contextvars.ContextVar('v', default=None)",
            "ContextVar('w')",
            "_var.set(2)",
            "_var.reset(token)",
        ]
    )


def test_run_values_are_bound_and_listed():
    from slimrl.patches.rollouts import multiturn, vllm_rollouts
    from slimrl.sandbox import limits  # noqa: F401 (declares sandbox_deadline)

    assert not multiturn.in_tool_turns() and "tool_turns" not in swaps.run_values(changed_only=True)
    with pytest.raises(RuntimeError), vllm_rollouts.TRAINER_ARGS.bound("args"):
        assert swaps.run_values(changed_only=True)["vllm_trainer_args"][1] == "args"
        raise RuntimeError
    assert vllm_rollouts.TRAINER_ARGS.get() is None and "vllm_trainer_args" not in swaps.run_values(True)
    assert {"import_hook", "versions_checked", "tool_turns", "sandbox_deadline"} <= set(swaps.run_values())
    with pytest.raises(ValueError, match="already declared"):
        swaps.RunValue("tool_turns", False, "twice")


def test_no_direct_change_outside_the_swap_module():
    found, allowed_seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        if relative in OWNERS:
            continue
        for change in direct_changes(path.read_text()):
            if (relative, change) in ALLOWED:
                allowed_seen.add((relative, change))
            else:
                found.append(f"{relative}: {change}")
    assert found == [], "route these through slimrl.swaps (swap / set_field / adjust_default):\n" + "\n".join(found)
    assert allowed_seen == set(ALLOWED), f"allow-list entries no longer needed: {set(ALLOWED) - allowed_seen}"


def test_the_scan_has_teeth():
    source = """
import types
def fused(self): pass
model.forward = types.MethodType(fused, model)
model.generate = fused
tok.apply = lambda *a: 0
setattr(lm_head, "forward", head)
object.__setattr__(cfg, "x", 1)
model.__dict__["save"] = method
args.max_length = 8
training_args.use_cpu = True
state.count = 1
"""
    assert len(direct_changes(source)) == 8


def test_swaps_nest_and_restore_exactly():
    obj = types.SimpleNamespace(kept=1)
    swaps.swap(obj, "forward", "fused", "the fused head")
    swaps.swap(obj, "forward", "sharing", "the shared prefix")
    swaps.swap(obj, "kept", 2, "changed")
    assert obj.forward == "sharing" and swaps.swapped(obj)["forward"] == "the fused head; then the shared prefix"
    swaps.restore(obj, "forward")
    assert obj.forward == "fused" and swaps.swapped(obj)["forward"] == "the fused head"
    swaps.restore(obj, "forward")
    swaps.restore(obj, "kept")
    assert not hasattr(obj, "forward") and obj.kept == 1 and swaps.swapped(obj) == {}
    swaps.restore(obj, "forward")  # nothing recorded: nothing to do


def _layer(tag):
    """A scoring layer's `make`: wraps the current forward in a function that says which layers it went through."""

    def make(obj, inner):
        def forward():
            return [tag, *inner()]

        return forward

    return make


def _model():
    model = types.SimpleNamespace()
    swaps.swap(model, "forward", lambda: ["head"], "the fused head")
    return model


def test_scoring_layers_go_on_in_order_once_and_come_off():
    a, b, plain = _model(), _model(), type("Plain", (), {"forward": lambda self: ["class"]})()
    with swaps.scoring_layer([a, b, a, None, plain], "forward", swaps.PADDING_FREE_LAYER, _layer("pf")) as first:
        assert first == [a, b]  # each object once; `plain` has no forward of its own (own=True): left alone
        with swaps.scoring_layer([a], "forward", swaps.PADDING_FREE_LAYER, _layer("again")) as nested:
            assert nested == [] and a.forward() == ["pf", "head"]  # a nested seam leaves the outer one's layer
        with swaps.scoring_layer([a], "forward", swaps.SHARED_PREFIX_LAYER, _layer("sp")):
            assert a.forward() == ["sp", "pf", "head"] and b.forward() == ["pf", "head"]
            with swaps.scoring_layer([a], "forward", swaps.PADDING_FREE_LAYER, _layer("pf2")) as under:
                assert under == [] and a.forward() == ["sp", "pf", "head"]  # never under a layer after it
        assert swaps.wears(a, "forward", swaps.PADDING_FREE_LAYER)
        assert not swaps.wears(a, "forward", swaps.SHARED_PREFIX_LAYER)
    assert a.forward() == ["head"] and b.forward() == ["head"] and plain.forward() == ["class"]
    assert swaps.swapped(a) == {"forward": "the fused head"}


def test_a_scoring_layer_comes_off_on_an_error_and_make_can_decline():
    a, b = _model(), _model()
    with pytest.raises(RuntimeError):
        with swaps.scoring_layer(
            [a, b], "forward", swaps.SHARED_PREFIX_LAYER, lambda obj, inner: None if obj is b else inner
        ):
            assert swaps.wears(a, "forward", swaps.SHARED_PREFIX_LAYER)
            assert not swaps.wears(b, "forward", swaps.SHARED_PREFIX_LAYER)
            raise RuntimeError
    assert not swaps.wears(a, "forward", swaps.SHARED_PREFIX_LAYER) and a.forward() == ["head"]


def test_records_that_no_longer_describe_the_attribute_are_not_worn():
    model = _model()
    swaps.swap(model, "forward", lambda: ["pf"], swaps.PADDING_FREE_LAYER)
    assert swaps.wears(model, "forward", swaps.PADDING_FREE_LAYER)
    vars(model)["forward"] = lambda: ["set again"]  # someone else set it (the negative control)
    assert not swaps.wears(model, "forward", swaps.PADDING_FREE_LAYER)
    with swaps.scoring_layer([model], "forward", swaps.PADDING_FREE_LAYER, _layer("pf")) as installed:
        assert installed == [model] and model.forward() == ["pf", "set again"]


def test_adjust_default_keeps_what_the_user_set():
    from trl import GRPOConfig

    args = GRPOConfig(output_dir="out", max_completion_length=8, report_to="none", use_cpu=True)
    config_state(args).user_fields = frozenset({"max_completion_length"})
    assert not swaps.adjust_default(args, "max_completion_length", 4, "test")
    assert args.max_completion_length == 8
    assert swaps.adjust_default(args, "temperature", 0.5, "test")  # TRL's default, not the user's
    assert args.temperature == 0.5 and swaps.swapped(args)["temperature"] == "test"
    swaps.restore(args, "temperature")
    assert args.temperature == 1.0
    config_state(args).user_fields = None  # unknown (dataclasses.replace): judged by the value against the default
    assert not swaps.adjust_default(args, "max_completion_length", 4, "test")


@pytest.fixture
def grpo():
    import slimrl

    slimrl.PatchFastRL("grpo")
    yield
    slimrl.unpatch()


def test_describe_lists_class_patches_and_instance_swaps(grpo, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import slimrl
    from slimrl.testing import tiny_llama, tiny_tokenizer

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_completion_length=4
    )
    trainer = GRPOTrainer(
        model=tiny_llama(),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a b", "c d"]}),
        processing_class=tiny_tokenizer(),
    )
    described = slimrl.describe(trainer)
    assert "GRPOTrainer.training_step" in described.class_level
    config, model = described.parts[0], described.parts[1]
    assert config.instance_level["slimrl_num_chunks"] == "a slimrl field"
    assert "GRPOConfig.__post_init__" in config.class_level
    assert "fused LM head" in model.instance_level["forward"]
    assert "training_step" in str(described) and "instance forward" in str(described)
    from slimrl.patches.rollouts.vllm_rollouts import TRAINER_ARGS

    assert "vllm_trainer_args" not in str(described)
    with TRAINER_ARGS.bound(args):  # a run-time value off its default is listed last, with why and its value
        assert "instance vllm_trainer_args: the trainer config" in str(slimrl.describe(trainer).parts[-1])
