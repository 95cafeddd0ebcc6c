"""scripts/check_upstream.py, the scheduled upstream check's report: versions against slimrl/versions.py, every
registry seam checked one by one (a moved one named, the others still checked), PatchFastRL(None) + unpatch()."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "check_upstream.py"
spec = importlib.util.spec_from_file_location("check_upstream", SCRIPT)
check_upstream = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_upstream)


def test_the_installed_libraries_move_no_seam(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLIMRL_ALLOW_UNSUPPORTED", "1")  # main() sets it; restored after the test
    assert check_upstream.main(["--json", str(tmp_path / "report.json")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert all(row["inside"] for row in report["versions"]) and report["round_trip"] is None
    assert report["seams"] and not any(row["moved"] for row in report["seams"])
    assert "registry seams: " in capsys.readouterr().out


def test_a_moved_seam_is_named_and_the_others_still_checked(monkeypatch):
    from slimrl.patches import registry
    from slimrl.patches.seams import Patch

    moved = Patch("trl.trainer.grpo_trainer.GRPOTrainer", "_gone_in_a_later_trl", ("self",), lambda o: o, "a test")
    monkeypatch.setitem(registry.ALGORITHMS, "grpo", [*registry.ALGORITHMS["grpo"], moved])
    rows = check_upstream.seam_verdicts()
    named = [row for row in rows if row["moved"]]
    assert [row["seam"] for row in named] == [moved.seam]
    assert "`_gone_in_a_later_trl` is not defined" in named[0]["moved"]
    assert len(rows) > 40  # every other seam was still checked
