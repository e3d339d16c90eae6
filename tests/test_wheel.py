"""The package as users get it: ``python -m build`` makes a wheel and an sdist; the wheel,
installed into a fresh virtual environment (``--system-site-packages`` over this one's
interpreter, so vLLM and torch are not installed again), exposes our entry points to vLLM's
loaders and the ``constrained`` command. No engine (the engine side is the session ``llm``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import constrained

ROOT = Path(__file__).resolve().parent.parent
CHECK = """
import json, sys
from importlib.metadata import distribution, entry_points
dist = distribution("constrained")
def ours(group):
    return [e.value for e in entry_points(group=group) if e.dist.name == "constrained"]
procs, ends = ours("vllm.logits_processors"), ours("vllm.endpoint_plugins")
from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_plugins
import constrained
from constrained.processors.truncation_math import host_kernel
print("RESULT " + json.dumps({"version": dist.version, "procs": procs, "ends": ends,
      "module": constrained.__file__, "v2": len(_load_v2_logitsprocs_plugins()),
      "host_kernel": host_kernel() is not None}))
"""


@pytest.mark.slow
def test_wheel_builds_installs_and_registers(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT / "constrained", source / "constrained",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, source / name)
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist",
         "--outdir", str(dist), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [wheel] = dist.glob("constrained-*.whl")
    [sdist] = dist.glob("constrained-*.tar.gz")
    assert constrained.__version__ in wheel.name and constrained.__version__ in sdist.name

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)  # fmt: skip
    python = venv / "bin" / "python"
    # vLLM and torch from this environment, after the venv's own site-packages (a plain path
    # line: this environment's editable install of the package is not loaded).
    [own] = venv.glob("lib/python*/site-packages")
    here = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (own / "zz_outer_env.pth").write_text("\n".join(here) + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    # Run outside the repository (its checkout must not be what is imported).
    env = {**os.environ, "CONSTRAINED_CACHE": str(tmp_path / "cache")}  # compiles afresh
    out = subprocess.run([str(python), "-c", CHECK], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    [line] = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    found = json.loads(line[len("RESULT ") :])
    assert found["version"] == constrained.__version__
    assert str(venv) in found["module"]
    assert len(found["procs"]) == len(constrained.LOGITS_PROCESSORS)
    assert found["ends"] == ["constrained.plugin:endpoint_plugin"]
    assert found["v2"] >= len(constrained.LOGITS_PROCESSORS)
    assert found["host_kernel"]  # the C source ships in the wheel and compiles from there
    version = subprocess.run([str(venv / "bin" / "constrained"), "--version"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert version.returncode == 0, version.stderr[-3000:]
    assert version.stdout.strip() == f"constrained {constrained.__version__}"
