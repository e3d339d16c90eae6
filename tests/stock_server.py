"""vLLM's stock OpenAI server (``python -m vllm.entrypoints.openai.api_server``, not our
launcher) with our package only installed: ``VLLM_PLUGINS=constrained`` and vLLM's own flags."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
import urllib.request

from tests.soak import Server, free_port

BASE_FLAGS = ("--dtype", "float32", "--enforce-eager", "--generation-config", "vllm",
              "--seed", "0", "--served-model-name", "tiny")  # fmt: skip


def start_stock_server(
    model: str, workdir: pathlib.Path, flags: tuple[str, ...] = (), plugins: str = "constrained"
) -> Server:
    """Start it on loopback and wait until healthy (up to 300 s)."""
    port = free_port()
    log_path = workdir / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_PLUGINS": plugins,
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}  # fmt: skip
    for ours in ("CONSTRAINED_ROUTE_STRUCTURED_OUTPUTS", "CONSTRAINED_TOOL_CALL_PARSER"):
        env.pop(ours, None)  # the plugin alone turns routing on
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--host", "127.0.0.1", "--port", str(port), *BASE_FLAGS, *flags]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(proc, f"http://127.0.0.1:{port}", workdir / "none.json", log_path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(server.base + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            time.sleep(1)
    server.stop()
    raise RuntimeError(f"server not healthy in 300 s:\n{log_path.read_text()[-3000:]}")
