"""slimrl/versions.py: the supported ranges, checked when slimrl's API is first used, and kept equal to pyproject's."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from slimrl import versions


def test_installed_libraries_are_supported():
    assert versions.problems() == []


def test_unsupported_version_names_library_version_range_and_command(monkeypatch):
    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda p: "4.50.0" if p == "transformers" else real(p))
    monkeypatch.delenv("SLIMRL_ALLOW_UNSUPPORTED", raising=False)
    with pytest.raises(
        ImportError,
        match=r"transformers 4\.50\.0 is installed; slimrl supports transformers>=5,<6\..*"
        r"pip install .*'transformers>=5,<6'",
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


def test_pyproject_ranges_are_the_table():
    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {m.group(1): m.group(2) for d in deps if (m := re.match(r"([A-Za-z_.-]+)(.*)", d))}
    for package, spec in versions.SUPPORTED.items():
        assert declared[package] == spec, (package, declared[package], spec)
