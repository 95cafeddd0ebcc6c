"""Rules the test suite keeps so that it cannot pass by not running: slimrl's required libraries are imported, never
`importorskip`ped (a TRL that moved `trl.trainer.utils` must fail the op-parity suite, not skip it silently)."""

import re
from pathlib import Path

TESTS = Path(__file__).parent
REQUIRED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")  # slimrl/versions.py's SUPPORTED
SKIP_OF_REQUIRED = re.compile(r"importorskip\(\s*[\"'](" + "|".join(REQUIRED) + r")(\.|[\"'])")


def skips_of_required(text: str) -> list[str]:
    return [m.group(0) for m in SKIP_OF_REQUIRED.finditer(text)]


def test_no_test_skips_when_a_required_library_or_its_internals_are_missing():
    found = {
        str(path.relative_to(TESTS)): hits
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__) and (hits := skips_of_required(path.read_text()))
    }
    assert found == {}, f"import these instead (a moved module must fail loudly): {found}"


def test_the_rule_sees_what_it_forbids_and_spares_optional_extras():
    from slimrl import versions

    assert set(REQUIRED) == set(versions.SUPPORTED)
    assert skips_of_required('x = pytest.importorskip("trl.trainer.utils")') == ['importorskip("trl.']
    assert skips_of_required("pytest.importorskip('peft')") == ["importorskip('peft'"]
    assert skips_of_required('pytest.importorskip("vllm")') == []  # optional tiers may skip, and say why
    assert skips_of_required('pytest.importorskip("trlx")') == []
