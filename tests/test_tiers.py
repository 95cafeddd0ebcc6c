"""The tiers CI runs: scripts/test.sh's TIERS is the one list (every scripts/test_NAME.sh is in it or in NOT_IN_CI),
.ci/run runs the README's test command, and in strict mode (SLIMRL_CI=1, tests/_ci_mode.py) a skip for a missing
install fails."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import _ci_mode
import _tier_budget

ROOT = Path(__file__).parents[1]
RUNNER = ROOT / "scripts" / "test.sh"
TEST_COMMAND = "bash scripts/test.sh"  # what CI runs and the README shows, word for word


def _bash_list(name: str) -> list[str]:
    found = re.search(rf"^{name}=\(([^)]*)\)", RUNNER.read_text(), re.M)
    assert found, f"scripts/test.sh has no {name}=(...) line"
    return found.group(1).split()


def test_every_tier_script_is_in_ci_or_said_not_to_be():
    tiers, off = _bash_list("TIERS"), _bash_list("NOT_IN_CI")
    scripts = {path.name[len("test_") : -len(".sh")] for path in (ROOT / "scripts").glob("test_*.sh")}
    assert not set(tiers) & set(off), "a tier is both in CI and out of it"
    assert scripts == set(tiers) | set(off), (
        f"list each tier script in TIERS or NOT_IN_CI: {scripts ^ set(tiers + off)}"
    )
    assert "default" in tiers
    assert {"default", "slow", "vllm", "distributed", "notebooks"} <= set(tiers) | set(off)
    for name in off:  # each tier left out of CI says why, on its line
        assert re.search(rf"^NOT_IN_CI=.*# .*\b{name}: \S", RUNNER.read_text(), re.M), f"no reason given for {name}"


def test_ci_runs_the_readme_test_command_with_no_arguments():
    run_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert run_lines[-1] == f"exec {TEST_COMMAND}", "the last line of .ci/run must be the README's test command"
    for page in (ROOT / "README.md", ROOT / "docs" / "testing.md"):
        commands = [line.split("#")[0].strip() for line in page.read_text().splitlines()]
        assert TEST_COMMAND in commands, f"{page.name} does not show {TEST_COMMAND!r}"


def test_strict_mode_reads_missing_installs_and_the_tier_that_owns_a_package():
    assert _ci_mode.fails_in_ci("could not import 'gguf': No module named 'gguf'", "not slow and not vllm")
    assert _ci_mode.fails_in_ci("the embedded model's package is not installed", "slow")
    assert not _ci_mode.fails_in_ci("vLLM is not installed (bash scripts/install_vllm.sh)", "not slow and not vllm")
    assert _ci_mode.fails_in_ci("vLLM is not installed (bash scripts/install_vllm.sh)", "vllm")
    assert _ci_mode.fails_in_ci("DeepSpeed is not installed: bash scripts/install_deepspeed.sh", "distributed")
    assert _ci_mode.fails_in_ci("vllm.SamplingParams needs vLLM installed", "vllm")
    assert not _ci_mode.fails_in_ci("needs a CUDA GPU (torch.cuda.is_available() is False)", "")


SKIPPING_TESTS = {
    "test_skips.py": """
        import pytest

        def test_missing_package():
            pytest.importorskip("slimrl_no_such_package")

        def test_no_gpu():
            pytest.skip("needs a CUDA GPU")

        @pytest.mark.vllm
        def test_vllm():
            pytest.skip("vLLM is not installed (bash scripts/install_vllm.sh)")
        """,
    "test_module_skip.py": """
        import pytest

        pytest.importorskip("slimrl_no_such_package_either")

        def test_never_collected():
            pass
        """,
}


def _run_skipping_tests(tmp_path: Path, strict: bool, *args: str) -> str:
    for name, text in SKIPPING_TESTS.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: the vLLM tier\n")
    env = {k: v for k, v in os.environ.items() if k != "SLIMRL_CI"}
    env.update(PYTHONPATH=str(Path(__file__).parent), **({"SLIMRL_CI": "1"} if strict else {}))
    command = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "_ci_mode", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout


def test_strict_mode_fails_a_skip_for_a_missing_package_and_keeps_other_skips(tmp_path):
    out = _run_skipping_tests(tmp_path, True, "--continue-on-collection-errors")
    assert "1 failed, 2 skipped, 1 error" in out and "FAILED test_skips.py::test_missing_package" in out, out
    assert "ERROR test_module_skip.py" in out, out  # a whole module skipped at collection fails too
    assert "SLIMRL_CI=1 allows no skip for a missing install" in out
    in_vllm_tier = _run_skipping_tests(tmp_path, True, "-m", "vllm", "test_skips.py")
    assert "FAILED test_skips.py::test_vllm" in in_vllm_tier, in_vllm_tier  # its own tier: vLLM must be there


def test_without_strict_mode_every_skip_stays_a_skip(tmp_path):  # the negative control
    out = _run_skipping_tests(tmp_path, False)
    assert "4 skipped" in out and "failed" not in out and "error" not in out, out


def test_every_test_moved_to_the_slow_tier_exists_and_says_why():
    for key, reason in _tier_budget.MOVED_TO_SLOW.items():
        path, _, name = key.partition("::")
        assert (ROOT / path).is_file(), f"{key}: no such file"
        function = name.split("::")[-1].split("[")[0]
        assert not function or re.search(rf"^\s*def {re.escape(function)}\(", (ROOT / path).read_text(), re.M), key
        assert len(reason.split()) >= 4, f"{key}: say why it left the default tier"


def test_a_moved_test_is_marked_slow_and_the_default_tier_does_not_collect_it(request):
    assert _tier_budget.moved("tests/x.py::test_y[3]") is None  # the negative control: an unlisted test stays
    key = next(iter(_tier_budget.MOVED_TO_SLOW))
    assert _tier_budget.moved(key) == key and _tier_budget.moved(key + "::test_a[1]") == key
    formats = "tests/patches/setup/test_dataset_formats.py::test_patched_accepts_what_stock_accepts"
    assert _tier_budget.moved(f"{formats}[kto-standard_preference]") and not _tier_budget.moved(f"{formats}[dpo-x]")
    if "not slow" in request.config.option.markexpr:
        collected = [item.nodeid for item in request.session.items if _tier_budget.moved(item.nodeid)]
        assert collected == [], "the marker came after -m selected: _tier_budget's hook must run first"
