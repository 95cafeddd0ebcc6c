"""The README's two commands (scripts/train.sh, scripts/test.sh; .ci/run calls the second) install into the
project's virtual environment, .venv, and work where the system Python refuses pip (PEP 668,
"externally-managed-environment"); the install is idempotent and quick when done."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# Run on the project environment; the GPU tier's scripts run on a bare GPU machine's own Python instead (no network
# there: scripts/gpu_env.sh installs carried wheels with --target, which PEP 668 does not refuse)
VENV_SCRIPTS = [
    *(ROOT / "scripts" / name for name in ("install.sh", "test.sh", "train.sh", "install_vllm.sh")),
    *(ROOT / "scripts" / name for name in ("install_deepspeed.sh", "test_distributed.sh", "test_vllm.sh")),
    ROOT / "scripts" / "check_upstream.sh",
    ROOT / ".ci" / "run",
]
BARE_PYTHON = re.compile(r"(^|[\s;(|&])(exec\s+)?python3?\s")  # `python3 ...` run from PATH, not "$PY"


def test_scripts_run_python_from_an_environment_never_the_base_interpreter():
    assert BARE_PYTHON.search("exec python3 -m pytest") and BARE_PYTHON.search("python3 -m ruff check .")
    assert not BARE_PYTHON.search('exec "$PY" -m pytest') and not BARE_PYTHON.search("exec .venv-vllm/bin/python -m x")
    for script in VENV_SCRIPTS:
        lines = [line for line in script.read_text().splitlines() if not line.lstrip().startswith("#")]
        bare = [line for line in lines if BARE_PYTHON.search(line)]
        assert bare == [], f"{script.name}: {bare}"


def test_an_old_base_python_is_refused_naming_the_fix(tmp_path):
    old = tmp_path / "python3"
    old.write_text('#!/bin/sh\n[ "$1" = "-V" ] && echo "Python 3.10.12"\nexit 1\n')
    old.chmod(0o755)
    out = subprocess.run(
        ["bash", "-c", "source scripts/venv.sh && check_base_python"],
        cwd=ROOT,
        env={**os.environ, "SLIMRL_BASE_PYTHON": str(old)},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert "slimrl needs Python >= 3.11 (TRL 1.16 does)" in out.stderr and "Python 3.10.12" in out.stderr
    assert "SLIMRL_BASE_PYTHON" in out.stderr


def _externally_managed_python(tmp_path: Path) -> str:
    """A base interpreter that refuses `pip install` (PEP 668): the system's own where it has the marker, else a
    stand-in that answers pip installs as such a Python does and runs everything else (venv included)."""
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if not candidate or not os.path.exists(candidate):
            continue
        probe = subprocess.run(
            [
                candidate,
                "-c",
                "import sys, sysconfig; print(sysconfig.get_path('stdlib'), sys.prefix == sys.base_prefix,"
                " sys.version_info >= (3, 11))",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        if len(probe) == 3 and probe[1:] == ["True", "True"] and (Path(probe[0]) / "EXTERNALLY-MANAGED").exists():
            return candidate
    real = getattr(sys, "_base_executable", sys.executable)
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ] && [ "$3" = "install" ]; then\n'
        '  echo "error: externally-managed-environment" >&2; exit 1\n'
        "fi\n"
        f'exec "{real}" "$@"\n'
    )
    shim.chmod(0o755)
    return str(shim)


def _copy_of_the_repository(tmp_path: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    ).stdout.split(b"\0")
    copy = tmp_path / "slimrl"
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            (copy / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name.decode())
    return copy


@pytest.mark.slow
def test_the_readme_commands_work_where_the_system_python_refuses_pip(tmp_path):
    base = _externally_managed_python(tmp_path)
    refused = subprocess.run([base, "-m", "pip", "install", "--dry-run", "six"], capture_output=True, text=True)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr  # the premise
    repo = _copy_of_the_repository(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "SLIMRL_"))}
    env.update(SLIMRL_BASE_PYTHON=base, OMP_NUM_THREADS="1")

    def run(*command, timeout=1500):
        return subprocess.run(["bash", *command], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)

    tested = run("scripts/test.sh", "-p", "no:randomly", "tests/test_versions.py")
    assert tested.returncode == 0, tested.stderr[-3000:] + tested.stdout[-2000:]
    assert (repo / ".venv" / "bin" / "slimrl").exists() and "passed" in tested.stdout
    start = time.perf_counter()
    again = run("scripts/install.sh", "dev")
    assert again.returncode == 0 and again.stderr == "" and time.perf_counter() - start < 20  # idempotent, quick
    trained = run(
        "scripts/train.sh", "--max_steps", "1", "--num_eval_samples", "0", "--output_dir", str(tmp_path / "r")
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "r" / "adapter_model.safetensors").exists()
