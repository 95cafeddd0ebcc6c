"""Patching on import (on_import.patch_on_import, auto.py), as Unsloth patches TRL when it is imported.

The TRL tests run fresh interpreters without SLIMRL_NO_AUTO_PATCH (which tests/conftest.py sets for the in-process
suite), in both import orders. The hook's own rules (nested imports, a failing patch, forgetting) are tested on a
small package written to tmp_path, so each case takes milliseconds.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import slimrl
from slimrl.patches import registry
from slimrl.patches.auto import ImportHook
from slimrl.patches.on_import import AUTO_PATCH_OFF

PATCHED = """
def patched(cls, method="__init__"):
    return hasattr(cls.__dict__[method], "__slimrl_seam__")
"""


def _run(code: str, **env) -> str:
    """`code` in a fresh interpreter that imports this checkout's slimrl, patching on import left on."""
    environ = {k: v for k, v in os.environ.items() if k != AUTO_PATCH_OFF}
    source = os.path.dirname(os.path.dirname(slimrl.__file__))
    environ["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [environ.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PATCHED + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, "OMP_NUM_THREADS": "1", **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_slimrl_first_every_trainer_patched_when_imported_and_unpatch_removes_the_hook():
    out = _run(
        """
        import sys
        import slimrl
        assert "trl" not in sys.modules and "vllm" not in sys.modules
        from slimrl import FastLanguageModel
        assert "trl" not in sys.modules and "vllm" not in sys.modules, "no TRL before the script imports it"
        import trl
        assert not slimrl.is_patched(), "import trl alone patches nothing"
        from trl import GRPOConfig, GRPOTrainer
        assert patched(GRPOTrainer) and patched(GRPOConfig) and slimrl.is_patched("grpo")
        assert "trl.trainer.dpo_trainer" not in sys.modules, "trainers the script does not import stay unloaded"
        assert GRPOConfig(output_dir="/tmp/slimrl-auto", slimrl_num_chunks=2).slimrl_num_chunks == 2
        from trl import DPOTrainer, ORPOConfig, ORPOTrainer, PPOTrainer  # ORPO, PPO: names TRL 1.16 lacks
        assert patched(DPOTrainer) and patched(ORPOTrainer) and PPOTrainer.__module__.startswith("slimrl.")
        assert slimrl.PatchFastRL("grpo") == registry_sorted(), "PatchFastRL on top: idempotent"
        assert patched(GRPOTrainer) and not hasattr(GRPOTrainer.__init__.__slimrl_original__, "__slimrl_seam__")
        slimrl.unpatch()
        assert not patched(GRPOTrainer) and not hasattr(trl, "ORPOConfig")
        from slimrl import FastLanguageModel  # after unpatch(): no patching on import again
        from trl.trainer.kto_config import KTOConfig  # imported after unpatch: stock
        assert not patched(KTOConfig) and not slimrl.is_patched()
        print("ok")
        """.replace("registry_sorted()", "sorted(slimrl.patches.registry._STATE.algorithms)")
    )
    assert out.strip().endswith("ok")


def test_opt_out_then_trl_first_then_fastlanguagemodel_patches_what_is_loaded():
    out = _run(
        """
        import os, sys
        from trl import GRPOTrainer, RLOOConfig
        config = RLOOConfig(output_dir="/tmp/slimrl-auto", bf16=False)  # built before slimrl: stock config
        os.environ["SLIMRL_NO_AUTO_PATCH"] = "1"  # opted out: TRL stays stock until PatchFastRL
        from slimrl import FastLanguageModel, PatchFastRL, is_patched
        assert not is_patched() and not patched(GRPOTrainer)
        assert PatchFastRL("grpo", FastLanguageModel) == ["grpo"] and patched(GRPOTrainer)
        del os.environ["SLIMRL_NO_AUTO_PATCH"]
        from slimrl import FastLanguageModel  # trl imported first: what is loaded is patched now
        from trl import RLOOTrainer
        assert is_patched("rloo") and patched(RLOOTrainer) and patched(RLOOConfig, "__post_init__")
        assert config.slimrl_reward_errors == "raise" and config.slimrl_num_chunks == -1
        assert not is_patched("dpo") and "trl.trainer.dpo_trainer" not in sys.modules
        import trl.trainer.dpo_trainer as m  # a later module: patched when it loads
        from slimrl.ops import logprob
        assert m.add_fused_lm_head is logprob.add_fused_lm_head and is_patched("dpo")
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


# -- the hook's rules, on a small package ---------------------------------------------------------------------------
PACKAGE = {  # each module's last line marks its code as run to the end
    "__init__.py": "",
    "config.py": "class Config:\n    pass\nDONE = True\n",
    "trainer.py": "from .config import Config\nclass Trainer:\n    pass\nDONE = True\n",
    "sub/__init__.py": "from .one import One\n",
    "sub/one.py": "class One:\n    pass\nDONE = True\n",
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    name = f"slimrl_hook_pkg_{abs(hash(str(tmp_path))) % 10**8}"
    for path, text in PACKAGE.items():
        target = tmp_path / name / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    applied = []
    hooks = []

    def make(apply=None, aliases=None):
        modules = {"train": frozenset({f"{name}.config", f"{name}.trainer"}), "one": frozenset({f"{name}.sub.one"})}

        def record(algorithm):
            # the patch sees every module of its algorithm run to its end
            for module in modules.get(algorithm, ()):
                assert getattr(sys.modules.get(module), "DONE", False), module
            applied.append(algorithm)
            if apply is not None:
                apply(algorithm)

        hook = ImportHook(name, lambda: (modules, aliases or {}), record)
        hooks.append(hook)
        hook.install()
        return hook

    yield name, make, applied
    for hook in hooks:
        hook.uninstall()
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


@pytest.mark.parametrize("first", ["config", "trainer"])
def test_hook_patches_once_when_the_algorithm_is_whole(package, first):
    import importlib

    name, make, applied = package
    make()
    importlib.import_module(f"{name}.{first}")  # the config alone also loads the trainer
    assert applied == ["train"] and f"{name}.trainer" in sys.modules
    assert type(sys.modules[f"{name}.trainer"].__loader__).__name__ != "_NotifyingLoader", "loader put back"
    importlib.import_module(f"{name}.sub")  # a package importing its module
    assert applied == ["train", "one"]


def test_hook_alias_lookup_and_no_such_module(package):
    name, make, applied = package

    def add_alias(algorithm):
        sys.modules[name].Alias = "the alias"

    make(apply=add_alias, aliases={f"{name}.Alias": "alias"})
    namespace = {}
    exec(f"from {name} import Alias", namespace)
    assert namespace["Alias"] == "the alias" and applied == ["alias"]
    with pytest.raises(ImportError):
        exec(f"from {name} import Missing", {})


def test_hook_failed_patch_raises_on_every_import_and_forget(package):
    import importlib

    name, make, applied = package

    def fail(algorithm):
        raise registry.PatchError(f"seam of {algorithm} moved")

    hook = make(apply=fail)
    for _ in range(2):  # never a silent fall-back to the unpatched module
        with pytest.raises(registry.PatchError, match="seam of train moved"):
            importlib.import_module(f"{name}.trainer")
    hook.forget(["train"])
    importlib.import_module(f"{name}.trainer")
    assert applied == ["train", "train"]


@pytest.mark.parametrize("name", ["FastLanguageModel", "FastModel", "FastVisionModel"])
def test_each_unsloth_loader_name_turns_patching_on_import_on(monkeypatch, name):
    from slimrl.patches import on_import

    calls = []
    monkeypatch.setattr(on_import, "patch_on_import", lambda: calls.append(name))
    getattr(slimrl, name)
    assert calls == [name]
    assert slimrl.PatchFastRL is not None  # a name that is not a loader leaves patching to the script
    assert calls == [name]
