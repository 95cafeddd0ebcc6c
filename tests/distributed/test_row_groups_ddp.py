"""Row groups under DDP (2 CPU processes, gloo): ranks plan their groups from their own rows, then agree on the
largest group count, so their forwards, loss evaluations and the collectives inside them (metric gathers, DDP's
gradient exchange) pair up. Negative control: without the agreement the run fails once the ranks' counts differ.

Tier: `distributed` (scripts/test_distributed.sh); ~1 minute per case on 2 cores.
"""

import json

import pytest

from _launch import ROOT, torchrun

pytestmark = pytest.mark.distributed
WORKER = ROOT / "tests/distributed/_row_groups_worker.py"


def test_ranks_agree_on_the_group_count(tmp_path):
    out = tmp_path / "row_groups.json"
    torchrun(WORKER, out)
    ranks = json.loads(out.read_text())
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert all(r["grouped_steps"] > 0 and r["grouped_passes"] > 0 for r in ranks), ranks
    assert all(r["equal_weights"] for r in ranks)  # DDP kept the ranks in step
    assert [[count for _, count in r["planned"]] for r in ranks][0] == [c for _, c in ranks[1]["planned"]]
    assert any(own != agreed for r in ranks for own, agreed in r["planned"]), "no rank had to split: weak case"


def test_without_agreement_the_collectives_do_not_pair_up(tmp_path):
    done = torchrun(WORKER, tmp_path / "control.json", "--no-agreement", check=False)
    assert done.returncode != 0
