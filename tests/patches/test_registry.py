"""PatchFastRL's contract: one registry, checked seams, idempotent, reversible, independent of import order."""

import re
import subprocess
import sys
import textwrap

import pytest

import slimrl
from slimrl.patches import registry, seams


def _snapshot():
    """The objects every registered seam holds right now (own attribute, or the inherited marker)."""
    snap = {}
    for algo in registry.supported_algorithms():
        for p in registry.ALGORITHMS[algo]:
            owner = seams.resolve(p.owner)
            snap[p.seam] = seams.own_attr(owner, p.name)
    return snap


def test_unknown_algorithm_lists_supported():
    with pytest.raises(ValueError, match=r"Unknown algorithm 'ppo2'.*grpo.*rloo"):
        slimrl.PatchFastRL("ppo2")
    assert not slimrl.is_patched()


def test_case_insensitive_and_returns_patched():
    assert slimrl.PatchFastRL("GrPo", slimrl.FastLanguageModel) == ["grpo"]
    assert slimrl.is_patched("grpo") and not slimrl.is_patched("rloo")


def test_idempotent_and_unpatch_restores_exactly():
    import trl.trainer.grpo_trainer as grpo_mod
    from trl import GRPOConfig, GRPOTrainer

    before = _snapshot()
    stock_head = grpo_mod.add_fused_lm_head
    slimrl.PatchFastRL("grpo")
    once = _snapshot()
    slimrl.PatchFastRL("grpo")
    assert _snapshot() == once, "a second PatchFastRL must not wrap again"
    assert grpo_mod.add_fused_lm_head is not stock_head
    assert GRPOTrainer.__dict__["__init__"] is not before["trl.trainer.grpo_trainer.GRPOTrainer.__init__"]
    assert GRPOConfig.__dict__["__post_init__"].__slimrl_seam__.endswith("GRPOConfig.__post_init__")
    slimrl.unpatch()
    assert _snapshot() == before
    assert grpo_mod.add_fused_lm_head is stock_head


def test_unpatch_one_algorithm_keeps_the_other():
    from trl import GRPOTrainer, RLOOTrainer

    stock_rloo_step = RLOOTrainer.__dict__["training_step"]
    slimrl.PatchFastRL(None)
    assert all(slimrl.is_patched(a) for a in registry.supported_algorithms())
    slimrl.unpatch("rloo")
    assert RLOOTrainer.__dict__["training_step"] is stock_rloo_step
    assert hasattr(GRPOTrainer.__dict__["training_step"], "__slimrl_seam__")
    assert slimrl.is_patched("grpo") and not slimrl.is_patched("rloo")


def test_moved_seam_raises_naming_seam_and_version_and_patches_nothing(monkeypatch):
    import trl
    from trl import GRPOTrainer

    before = _snapshot()
    monkeypatch.delattr(GRPOTrainer, "_generate_single_turn")
    with pytest.raises(slimrl.PatchError) as err:
        slimrl.PatchFastRL("grpo")
    assert "GRPOTrainer._generate_single_turn" in str(err.value) and trl.__version__ in str(err.value)
    monkeypatch.undo()
    assert _snapshot() == before and not slimrl.is_patched()


def test_changed_signature_raises(monkeypatch):
    from trl import GRPOTrainer

    monkeypatch.setattr(GRPOTrainer, "training_step", lambda self, batch: None)
    with pytest.raises(slimrl.PatchError, match=r"training_step.*expected parameters"):
        slimrl.PatchFastRL("grpo")
    assert not slimrl.is_patched()


@pytest.mark.parametrize(
    "module, name",
    [("trl.kernels.chunked_logprob", "_use_triton"), ("trl.trainer.utils", "_CHUNKED_LOGPROB_CHUNK_SIZE")],
)
def test_missing_trl_helper_the_head_reads_raises_naming_it(monkeypatch, module, name):
    import importlib

    before = _snapshot()
    monkeypatch.delattr(importlib.import_module(module), name)
    with pytest.raises(slimrl.PatchError, match=rf"relies on `{module}\.{name}`"):
        slimrl.PatchFastRL("grpo")
    assert _snapshot() == before and not slimrl.is_patched()


def test_unsupported_trl_version_names_both(monkeypatch):
    import trl

    from slimrl.versions import SUPPORTED

    monkeypatch.setattr(trl, "__version__", "2.3.0")
    with pytest.raises(slimrl.PatchError, match=rf"TRL {re.escape(SUPPORTED['trl'])}.*TRL 2\.3\.0 is installed"):
        slimrl.PatchFastRL("grpo")


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_import_slimrl_does_not_import_trl():
    assert _run("import sys, slimrl; print('trl' in sys.modules)").strip() == "False"


@pytest.mark.parametrize("trl_first", [True, False])
def test_import_order(trl_first):
    code = (
        (
            """
        from trl import GRPOTrainer, GRPOConfig
        from slimrl import PatchFastRL
        PatchFastRL("grpo")
        """
            if trl_first
            else """
        from slimrl import PatchFastRL
        PatchFastRL("grpo")
        from trl import GRPOTrainer, GRPOConfig
        """
        )
        + """
        import trl
        assert trl.GRPOTrainer is GRPOTrainer
        assert hasattr(GRPOTrainer.__init__, "__slimrl_seam__")
        assert GRPOConfig(output_dir="/tmp/slimrl-order", slimrl_num_chunks=2).slimrl_num_chunks == 2
        print("ok")
        """
    )
    assert _run(code).strip().endswith("ok")


@pytest.mark.parametrize("algo", ["dpo", "kto", "sft", "reward"])
def test_offline_trainer_patches_exactly_its_seams_and_unpatches(algo):
    before = _snapshot()
    assert slimrl.PatchFastRL(algo) == [algo]
    own = {p.seam for p in registry.ALGORITHMS[algo]}
    created = {p.seam for p in registry.ALGORITHMS[algo] if p.creates}  # the config fields' defaults
    assert set(registry.applied_seams()) == own and created
    after = _snapshot()
    for seam, obj in after.items():
        if seam in created:
            assert before[seam] is seams.MISSING and obj is not seams.MISSING
        elif seam in own:
            assert obj is not before[seam] and seams.unwrap_descriptor(obj).__slimrl_seam__ == seam
        else:
            assert obj is before[seam], f"{algo} touched {seam}"
    # DPO/KTO/SFT get slimrl's head; the reward model (sequence classification) has no head seam
    assert (f"trl.trainer.{algo}_trainer.add_fused_lm_head" in own) == (algo != "reward")
    slimrl.unpatch(algo)
    assert _snapshot() == before and not slimrl.is_patched()


def test_offline_trainers_share_nothing_and_unpatch_one_at_a_time():
    from trl import DPOTrainer, SFTTrainer

    stock_dpo_init = DPOTrainer.__dict__["__init__"]
    slimrl.PatchFastRL("dpo")
    slimrl.PatchFastRL("sft")
    slimrl.unpatch("dpo")
    assert DPOTrainer.__dict__["__init__"] is stock_dpo_init
    assert hasattr(SFTTrainer.__dict__["__init__"], "__slimrl_seam__") and slimrl.is_patched("sft")


def test_unsloth_style_dpo_import_after_patch():
    out = _run(
        """
        from slimrl import FastLanguageModel, PatchFastRL
        PatchFastRL("dpo", FastLanguageModel)
        from trl import DPOConfig, DPOTrainer
        import trl.trainer.dpo_trainer as m
        from slimrl.ops import logprob
        assert m.add_fused_lm_head is logprob.add_fused_lm_head
        assert hasattr(DPOTrainer.__init__, "__slimrl_seam__")
        cfg = DPOConfig(output_dir="/tmp/slimrl-order-dpo", unsloth_num_chunks=2)
        import torch
        assert cfg.slimrl_num_chunks == 2 and (cfg.bf16 is False or torch.cuda.is_available())
        print("ok")
        """
    )
    assert out.strip().endswith("ok")
