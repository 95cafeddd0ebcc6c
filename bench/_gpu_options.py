"""The command line of bench/gpu_memory.py: its flags, the arm lists and the presets (a preset fills the flags the
command line does not give)."""

from __future__ import annotations

import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("grpo", "bisect", "pref")
GRPO_ARMS = ["stock", "stock-offload", "stock-ga8", "slimrl", "slimrl-offload", "unsloth"]
SPEED_CORE = ["stock", "stock-liger", "stock-ga8", "slimrl", "unsloth", "unsloth-ga8"]
LEVER_ARMS = ["slimrl-no-speed-levers", "slimrl-only-cast-skip", "slimrl-only-fused-lora", "slimrl-only-liger"]
SEARCH_ARMS = ["slimrl", "stock-ga8", "unsloth"]
PROFILED = ["stock", "slimrl-no-speed-levers", "slimrl"]
PRESETS = {
    "quick": dict(only=["grpo"], models=["8b", "1.5b"], lengths=[8192], arms=GRPO_ARMS, steps=2),
    "speed": dict(
        only=["grpo"],
        models=["8b", "1.5b"],
        lengths=[8192],
        arms=SPEED_CORE + LEVER_ARMS,
        steps=5,
        profile=PROFILED,
        lever_arms_last=True,
    ),
    "longest": dict(
        only=["bisect"], models=["8b"], bisect_arms=SEARCH_ARMS, resolution=4096, maximum=524288, timeout=480
    ),
    "full": dict(
        only=list(PARTS), models=["8b", "1.5b"], lengths=[8192, 2048], arms=GRPO_ARMS, steps=3, bisect_models=["8b"]
    ),
    "smoke": dict(
        only=list(PARTS),
        models=["smoke"],
        lengths=[16],
        arms=["stock", "stock-ga8", "slimrl", "slimrl-offload", "stock-liger", "unsloth-ga8", *LEVER_ARMS],
        steps=5,
        profile=["stock", "slimrl"],
        pref_length=64,
        start=16,
        resolution=16,
        maximum=32,
        single_row_length=48,
        device="cpu",
        threads=1,
        deadline=3600,
    ),
}


def parser(doc: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a set of the flags below (flags given win)")
    p.add_argument("--smoke", action="store_true", help="--preset smoke: CPU, toy model, every code path")
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--models", nargs="+", default=["8b", "1.5b"], help="8b, 1.5b (smoke: the CPU toy)")
    p.add_argument("--arms", nargs="+", default=GRPO_ARMS, help=", ".join(GRPO_ARMS))
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 2048], help="GRPO completion tokens")
    p.add_argument("--rows", type=int, default=8, help="GRPO completions per optimizer step (one prompt, G = rows)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps; s/step: the median of all but the first")
    p.add_argument("--profile", nargs="*", default=[], help="arms that run one more step, profiled (kernel categories)")
    p.add_argument("--lever-arms-last", action="store_true", help="the slimrl-only-* arms after every model's others")
    p.add_argument("--rollouts", choices=["synthetic", "generate"], default="synthetic", help=argparse.SUPPRESS)
    p.add_argument("--bisect-models", nargs="+", help="models the longest-fit search runs on (default: --models)")
    p.add_argument("--bisect-arms", nargs="+", default=SEARCH_ARMS, help="arms the longest-fit search runs")
    p.add_argument("--start", type=int, default=16384, help="first probe of the search without a prediction")
    p.add_argument("--single-row-length", type=int, default=262144, help="slimrl's 1-row probe (0: none)")
    p.add_argument("--device-memory-gib", type=float, help="the device's memory for the prediction (default: read)")
    p.add_argument("--resolution", type=int, default=4096)
    p.add_argument("--maximum", type=int, default=262144)
    p.add_argument("--guess-from", nargs="*", default=[], help="JSON files with GRPO rows at two or more lengths")
    p.add_argument("--pref-trainers", nargs="+", default=["dpo", "orpo"])
    p.add_argument("--pref-length", type=int, default=4096, help="DPO/ORPO tokens per row (prompt + answer)")
    p.add_argument("--pref-pairs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900, help="seconds one child may run")
    p.add_argument("--deadline", type=float, default=570, help="seconds this command may run in all")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gpu_memory"), help="results folder")
    p.add_argument("--json", help="also write the results file here (with --report: the joined rows)")
    p.add_argument("--unsloth-site", default=os.environ.get("UNSLOTH_SITE"), help="Unsloth's own package folder")
    p.add_argument("--model-dir", default="/tmp/slimrl-bench-models", help="model folders the Unsloth arm loads")
    p.add_argument("--report", nargs="+", help="print the tables of these JSON files and exit")
    for hidden in ("--child", "--arm", "--model", "--trainer", "--model-folder"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--profile-step", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--accumulation", type=int, help=argparse.SUPPRESS)
    return p


def parse(argv=None, doc: str | None = None) -> argparse.Namespace:
    """The flags, with the preset's values where a flag was not given on the command line."""
    a = parser(doc).parse_args(argv)
    preset = "smoke" if a.smoke else a.preset
    if preset:
        bare = parser()
        for action in bare._actions:
            action.default = argparse.SUPPRESS
        given = set(vars(bare.parse_args(argv)))
        for key, value in PRESETS[preset].items():
            if key not in given:
                setattr(a, key, value)
    a.preset = preset
    return a
