"""Session fixtures: one tiny model, one real vLLM engine (CPU build) for the whole run."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from constrained.tiny_model import build_tiny_model

    return str(build_tiny_model())


@pytest.fixture(scope="session")
def llm(tiny_model_dir: str):
    """The real engine with our processors registered. Never skipped: CI must run it."""
    from vllm import LLM

    import constrained
    from constrained.demo import engine_kwargs

    engine = LLM(
        model=tiny_model_dir, logits_processors=constrained.LOGITS_PROCESSORS, **engine_kwargs()
    )
    yield engine
    # Stop the engine process while pytest's streams are still open (quiet teardown).
    engine.llm_engine.engine_core.shutdown()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def server(tiny_model_dir: str, tmp_path_factory):
    """Our launcher (`python -m constrained serve`) on loopback; yields the base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [
        sys.executable, "-m", "constrained", "serve",
        "--model", tiny_model_dir, "--port", str(port), "--host", "127.0.0.1",
        "--dtype", "float32", "--enforce-eager", "--generation-config", "vllm",
        "--max-model-len", "1024", "--max-num-seqs", "64", "--served-model-name", "tiny",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError(f"server did not become healthy:\n{log.read_text()[-4000:]}")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
