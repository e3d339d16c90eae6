"""Our processors on vLLM's real Model Runner V2 sampling code, on CPU (Triton interpreter).

``harness`` patches Triton and torch globally when imported, so it is only ever imported in a
subprocess: ``python -m tests.v2_real.scenarios NAME`` (see ``tests/test_v2_real_sampler.py``).
Nothing in this package file imports vLLM.
"""


def run_cases(module: str, tag: str, *args: str) -> dict:
    """Run ``python -m tests.v2_real.MODULE ARGS`` (Triton's interpreter, in a process of its
    own: the harness patches Triton) and return the JSON on its ``TAG `` line."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", f"tests.v2_real.{module}", *args],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"{tag} "))
    return json.loads(line[len(tag) + 1 :])
