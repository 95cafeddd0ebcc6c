"""The default tier's time budget: tests moved from the default tier to the slow one, each with its reason, in one
list (CI runs the default tier within 4 minutes on 2 cores; docs/testing.md, "Time").

A test that costs more than about 3 s of CPU and is not the headline check of its feature belongs in the slow tier.
Its entry here marks it `slow` at collection (before `-m` selects), so the slow tier (`-m slow`) runs it and the
default tier does not, without an edit to the test's own file. A key is a test's node id, the node id of a module or
a test function (all its parameters), or a node id with `*` (any text: `...[kto-*]`). tests/test_tiers.py checks that
every key names an existing test function and that the default tier collects none of them. CI runs the slow tier
too, so nothing here leaves CI. The CPU seconds quoted are one run each with OMP_NUM_THREADS=1 on a shared
2-core machine (`python3 -m pytest --durations=40`, user + system time of the process and its children).
"""

import re

import pytest

P = "tests/patches/"
_SIBLING = (
    "one more case of a parametrized parity family, 1-2 s CPU each; the family's other cases stay in the default tier"
)
_LOSS = "accumulation equivalence of one more loss type, about 7 s CPU each (a run with and one without accumulation)"
_LOSS += "; the bnpo case (where stock differs from plain accumulation) stays in the default tier"
_FORMATS = "the dataset formats of one more trainer, 1.5-3 s CPU per trainer; GRPO's and DPO's stay in the default tier"

MOVED_TO_SLOW: dict[str, str] = {
    "tests/bench/test_preference_memory_smoke.py": "a benchmark smoke run (bench/preference_memory.py's child "
    "processes), 33 s CPU; the other bench smoke runs are slow tests too",
    **{
        f"{P}test_training_equivalence.py::test_accumulation_equivalence[{t}]": _LOSS
        for t in ("grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo", "rloo")
    },
    f"{P}test_registry.py::test_import_order[False]": "11 s CPU of fresh interpreters importing TRL; slimrl imported "
    "first is also test_auto_patch.py's slimrl-first case, and TRL first ([True]) stays in the default tier",
    f"{P}test_registry.py::test_unsloth_style_dpo_import_after_patch": "12 s CPU of fresh interpreters importing TRL; "
    "both import orders stay in the default tier (test_import_order[True], test_auto_patch.py)",
    f"{P}test_auto_patch.py::test_opt_out_then_trl_first_then_fastlanguagemodel_patches_what_is_loaded": "11 s CPU of "
    "fresh interpreters; the slimrl-first auto-patch case stays in the default tier",
    "tests/test_noise.py::test_the_api_and_the_cli_print_no_such_line": "14 s CPU of fresh interpreters running the "
    "API and the CLI end to end; the import-time checks of the same line and their control stay in the default tier",
    **{
        f"tests/training/test_interrupt_resume.py::test_interrupted_run_resumes_to_the_uninterrupted_result[{c}]": (
            "3-4 s CPU each (an interrupted and a straight run); the GRPO case stays in the default tier"
        )
        for c in ("dpo-15", "rloo-15")
    },
    "tests/test_architecture.py::test_registry_import_imports_no_trl": "8 s CPU of a fresh interpreter importing "
    "torch; the registry's declarative shape (every module a PATCHES list) stays in the default tier",
    "tests/bench/test_gpu_memory_bench.py::test_plan_follows_each_arm": "4 s CPU; the same file's check of the plan "
    "against the H100 peaks (within 15%) stays in the default tier",
    **{
        f"{P}trainers/test_grpo_parity.py::test_loss_types_lora_with_reference[{t}]": _SIBLING
        for t in ("dr_grpo", "cispo", "sapo", "luspo", "vespo")
    },
    **{
        f"{P}scoring/test_shared_prefix.py::test_grpo_loss_types_shared[{t}]": _SIBLING
        for t in ("dr_grpo", "dapo", "cispo", "sapo", "luspo")
    },
    **{
        f"{P}scoring/test_shared_prefix.py::test_grpo_targeted_shared[{c}]": _SIBLING
        for c in ("full-ref-spg2", "full-offload-seq-masktrunc")
    },
    **{
        f"{P}trainers/test_kto_parity.py::test_kto_matches_stock[{c}]": _SIBLING
        for c in ("apo_zero_unpaired-lora", "precompute-kto-full")
    },
    **{
        f"{P}trainers/test_dpo_parity.py::test_dpo_matches_stock[{c}]": _SIBLING
        for c in ("robust-full", "apo_zero-lora", "sigmoid+sft-full", "wpo-lora", "sppo_hard-lora-ga2")
    },
    **{
        f"{P}scoring/test_shared_prefix_dpo.py::test_dpo_shared_matches_stock[{c}]": _SIBLING
        for c in ("wpo-lora-checkpointing", "ld-alpha-sigmoid+sft-full")
    },
    **{
        f"{P}trainers/test_implicit_prompt_parity.py::test_orpo_cpo_implicit_prompt_matches_stock[{c}]": _SIBLING
        for c in ("orpo-standard-lora", "cpo-standard-simpo-lora", "orpo-standard-shared", "cpo-standard-shared-chunks")
    },
    **{
        f"{P}trainers/test_implicit_prompt_parity.py::test_dpo_kto_reward_implicit_prompt_matches_stock[{c}]": _SIBLING
        for c in ("dpo-standard", "kto-standard")
    },
    **{
        f"{P}trainers/test_cpo_parity.py::test_cpo_parity[{c}]": _SIBLING
        for c in ("hinge-lora", "simpo-cpoalpha-full", "alphapo-full")
    },
    **{
        f"{P}setup/test_dataset_formats.py::test_patched_accepts_what_stock_accepts[{t}-*]": _FORMATS
        for t in ("rloo", "kto", "sft", "reward", "cpo", "orpo")
    },
    **{
        f"tests/cli/test_cli_preference.py::test_two_step_run_leaves_adapter_metrics_plot[{t}]": "1.5 s CPU each; the "
        "DPO run of the same command stays in the default tier"
        for t in ("orpo", "kto")
    },
    **{
        f"{P}scoring/test_row_groups.py::test_grpo_loss_types_one_row_per_group[{t}]": "one more loss type through row "
        "groups, 1.3 s CPU each; grpo and cispo stay in the default tier"
        for t in ("bnpo", "dr_grpo", "dapo", "sapo", "luspo", "vespo")
    },
    **{
        f"{P}trainers/test_grpo_parity.py::test_targeted_combinations[{c}]": _SIBLING
        for c in (
            "lora-entropybonus-ga2-iters2-chunks3",
            "full-ref-spg2-dapo-chunks3",
            "full-ref-vespo-checkpointing-chunks1",
        )
    },
    **{
        f"{P}trainers/test_dpo_parity.py::test_dpo_matches_stock[{c}]": _SIBLING
        for c in ("precompute-full-ga2", "hinge-lora-ga2", "precompute-lora")
    },
    **{
        f"{P}trainers/test_rloo_parity.py::test_rloo_parity[{c}]": _SIBLING
        for c in ("full-beta0-ga2-masktrunc-temp-auto", "peftmodel-refadapter-checkpointing-chunks3")
    },
    f"{P}scoring/test_shared_prefix.py::test_rloo_shared[full-ref-ga2-iter2]": _SIBLING,
    f"{P}trainers/test_kto_parity.py::test_kto_matches_stock[kto-full-ga2-chunks3]": _SIBLING,
}


def _wildcard(key: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in key.split("*")))


def moved(nodeid: str) -> str | None:
    """The entry that moves this test to the slow tier, if any."""
    for key in MOVED_TO_SLOW:
        if (
            nodeid == key
            or nodeid.startswith((key + "[", key + "::"))
            or ("*" in key and _wildcard(key).fullmatch(nodeid))
        ):
            return key
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if moved(item.nodeid):
            item.add_marker(pytest.mark.slow)
