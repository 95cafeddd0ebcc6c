"""Preference data with an implicit prompt (only `chosen` / `rejected`; TRL takes their shared start as the prompt),
standard and conversational: the patched trainers match stock TRL (the parity rule of tests/patches/_parity.py).

ORPO and CPO (harness _orpo_cpo_parity), per-row and with shared-prefix forwards (`slimrl_shared_prefix=True` on the
patched side; each shared case checks the path was taken and every prompt forwarded once); DPO, KTO and the reward
model (harness _pref_parity), DPO with shared-prefix forwards too. The data are _formats' implicit-preference sets: the
prompts of different lengths, so both sides pad; conversational rows go through the chat template.
"""

import os
from pathlib import Path

import pytest

from slimrl.patches.scoring import shared_prefix as SP
from slimrl.patches.setup import shared_prefix_rules as rules

import _formats as F
import _orpo_cpo_parity as O
import _pref_parity as H
import _tiny as T

STANDARD, CONVERSATIONAL = "standard_implicit_preference", "conversational_implicit_preference"
SHARED = {rules.CONFIG_FIELD: True}

ORPO_CPO_CASES = {  # (algorithm, format, LoRA, config of every side, patched side's extra config)
    "orpo-standard-lora": ("orpo", STANDARD, True, {}, {}),
    "orpo-conversational-full-ga2": (
        "orpo",
        CONVERSATIONAL,
        False,
        dict(gradient_accumulation_steps=2, per_device_train_batch_size=2),
        {},
    ),
    "cpo-standard-simpo-lora": ("cpo", STANDARD, True, dict(loss_type="simpo", cpo_alpha=0.5, simpo_gamma=0.3), {}),
    "cpo-conversational-sigmoid-lora": ("cpo", CONVERSATIONAL, True, dict(label_smoothing=0.1), {}),
    "orpo-standard-shared": ("orpo", STANDARD, True, {}, SHARED),
    "orpo-conversational-shared": ("orpo", CONVERSATIONAL, True, dict(beta=0.3), SHARED),
    "cpo-standard-shared-chunks": ("cpo", STANDARD, True, dict(loss_type="ipo"), {**SHARED, "slimrl_num_chunks": 3}),
    "cpo-conversational-shared": ("cpo", CONVERSATIONAL, True, {}, SHARED),
}


def assert_shared_path_taken(trainer, micro_steps: int, forwards_per_step: int = 1) -> None:
    stats = SP.shared_prefix_stats(trainer)
    assert not stats.fallback_calls, stats.reasons
    assert stats.shared_calls == forwards_per_step * micro_steps
    assert stats.positions_forwarded < stats.positions_per_row_path


@pytest.mark.parametrize("case", list(ORPO_CPO_CASES))
def test_orpo_cpo_implicit_prompt_matches_stock(case, tmp_path, unpatched):
    algorithm, fmt, lora, config, patched = ORPO_CPO_CASES[case]
    trainers = O.build_sides(
        algorithm,
        lambda: T.tiny_model(0),
        config,
        str(tmp_path),
        O.lora_config() if lora else None,
        patched_config=patched,
        data=lambda: F.dataset(fmt),
    )
    assert "prompt_input_ids" in trainers.stock.train_dataset.column_names  # TRL extracted and tokenized a prompt
    traces = O.run_sides(algorithm, trainers)
    O.assert_traces_match(traces)
    if patched.get(rules.CONFIG_FIELD):
        assert_shared_path_taken(trainers.patched, len(traces.stock.losses))


PREF_CASES = {  # (algorithm, format, config of every side, patched side's extra config)
    "dpo-standard": ("dpo", STANDARD, dict(loss_type=["sigmoid"]), {}),
    "dpo-conversational-shared": ("dpo", CONVERSATIONAL, dict(loss_type=["ipo"]), SHARED),
    "kto-standard": ("kto", STANDARD, {}, {}),
    "kto-conversational": ("kto", CONVERSATIONAL, dict(per_device_train_batch_size=4), {}),
    "reward-conversational": ("reward", CONVERSATIONAL, {}, {}),
}


# Open (docs/parity.md, "Open cases"): under the rule of _parity.py this IPO case's second-step gradients with sharing
# fail on one tensor (layer 1's v_proj lora_B) on an AMD CPU's own MKL path: 1.10 of the bound on the 2-core AVX-512
# AMD EPYC the suite was measured on, one thread (bench/results/committed/parity_logp_omp1.json), deterministically.
# The same case passes on MKL's two other paths: 0.33 under MKL_CBWR=COMPATIBLE (parity_logp_mkl_cbwr.json) and 0.34
# on MKL's Intel path (scripts/mkl_intel_path.c preloaded; parity_logp_mkl_intel.json), the path an Intel CPU takes.
# Over 8 seeds of the model's weights (parity_spread_ipo.json) only the suite's seed is above the bound with sharing.
# settings that emulate other CPUs' kernels (docs/parity.md, "Margins on other CPUs"): this case not measured under them
EMULATION = ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def mkl_path(environ=os.environ, cpuinfo: str = "/proc/cpuinfo") -> str:
    """Which of MKL's float32 paths this process takes: "compatible", "intel", "amd-avx512" (the measured CPU's own
    path) or "unmeasured" (another CPU's own path, or kernels limited by an emulation setting)."""
    if environ.get("MKL_CBWR", "").upper() == "COMPATIBLE":
        return "compatible"
    if "mkl_intel_path" in environ.get("LD_PRELOAD", ""):
        return "intel"
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return "unmeasured"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    if environ.get("MKL_CBWR") or "avx512f" not in flags or any(environ.get(name) for name in EMULATION):
        return "unmeasured"
    if "GenuineIntel" in text:
        return "intel"  # what the preloaded library emulates, on an AVX-512 CPU
    return "amd-avx512" if "AuthenticAMD" in text else "unmeasured"


def ipo_shared_marks(path: str) -> list:
    """Strict where the case fails every time (the measured AMD path), not strict where no run measured it, none where
    it passes (MKL_CBWR=COMPATIBLE and MKL's Intel path: the case must pass there)."""
    reason = "IPO + sharing: second-step gradients at 1.10 of the bound on an AVX-512 AMD CPU's own MKL path"
    if path == "amd-avx512":
        return [pytest.mark.xfail(strict=True, reason=reason)]
    if path == "unmeasured":
        return [pytest.mark.xfail(strict=False, reason=f"{reason}; this CPU's path is not measured")]
    return []


def test_the_ipo_case_is_marked_by_mkl_path(tmp_path):
    amd, intel = tmp_path / "amd", tmp_path / "intel"
    amd.write_text("vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 avx512f\n")
    intel.write_text("vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f\n")
    assert mkl_path({}, str(amd)) == "amd-avx512"
    assert mkl_path({"MKL_CBWR": "COMPATIBLE"}, str(amd)) == "compatible"
    assert mkl_path({"LD_PRELOAD": "/tmp/b/libmkl_intel_path.so"}, str(amd)) == "intel"
    assert mkl_path({}, str(intel)) == "intel"
    assert mkl_path({"ATEN_CPU_CAPABILITY": "default"}, str(amd)) == "unmeasured"
    amd.write_text("vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2\n")
    intel.write_text("vendor_id\t: GenuineIntel\nflags\t\t: fpu avx2\n")
    assert (
        mkl_path({}, str(amd)) == mkl_path({}, str(intel)) == mkl_path({"MKL_CBWR": "AVX2"}, str(amd)) == "unmeasured"
    )
    assert [m.kwargs["strict"] for m in ipo_shared_marks("amd-avx512")] == [True]
    assert ipo_shared_marks("compatible") == ipo_shared_marks("intel") == []


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=ipo_shared_marks(mkl_path())) if c == "dpo-conversational-shared" else c
        for c in PREF_CASES
    ],
)
def test_dpo_kto_reward_implicit_prompt_matches_stock(case, tmp_path, unpatched):
    algorithm, fmt, config, patched = PREF_CASES[case]
    reward = algorithm == "reward"
    trainers = H.build_sides(
        algorithm,
        (lambda: H.tiny_reward_model(0)) if reward else (lambda: T.tiny_model(0)),
        config,
        str(tmp_path),
        None if reward else T.lora_config(),
        patched_config=patched,
        data=lambda: F.dataset(fmt),
    )
    traces = H.run_sides(algorithm, trainers)
    H.assert_traces_match(traces)
    if patched.get(rules.CONFIG_FIELD):  # DPO: the policy and the (adapter-disabled) reference forward per step
        assert_shared_path_taken(trainers.patched, len(traces.stock.losses), forwards_per_step=2)
