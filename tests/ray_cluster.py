"""A two-node Ray cluster on this machine, for ``tests/test_ray.py`` (issue #58).

Two ``ray start --block`` processes on loopback: a head and a second node, each a Ray node of
its own (its own raylet and object store) with one CPU and one logical ``GPU``. Each runs in
its own session, so stopping it ends every process it started (raylet, GCS, the vLLM workers
Ray spawned), and nothing else on the machine. Stopping kills them outright: the test has
nothing to drain, and a graceful stop costs seconds it does not need.

**Why a logical GPU, and the platform shim**: vLLM's CPU build refuses the Ray executor
outright: ``CpuPlatform.ray_device_key`` is empty, and ``initialize_ray_cluster`` raises
"current platform cpu does not support ray." (``vllm/v1/executor/ray_utils.py``; vLLM issue
#21602). vLLM places one rank per placement-group bundle of its platform's Ray device key
(``{"GPU": 1}`` on CUDA, ROCm and XPU). ``RayCpuPlatform`` below is the CPU platform with that
key set to ``"GPU"``, loaded through vLLM's own ``vllm.platform_plugins`` entry point (a
``.dist-info`` written to a temporary directory on ``PYTHONPATH``, test-only); each Ray node
declares one logical GPU, so the placement group's two bundles land on two nodes. Everything
else (the Ray executor, its workers, the CPU worker and model runner) is vLLM's, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.process_sessions import kill_sessions

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))

ENTRY_POINTS = "[vllm.platform_plugins]\nconstrained_test_ray_cpu = tests.ray_cluster:activate\n"


def activate() -> str:
    """The ``vllm.platform_plugins`` entry point: the CPU platform, with a Ray device key."""
    return "tests.ray_cpu_platform.RayCpuPlatform"


def write_platform_shim(directory: Path) -> Path:
    """A test-only distribution in ``directory`` whose entry point is ``activate``."""
    info = directory / "constrained_test_ray_cpu-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: constrained-test-ray-cpu\n"
                                   "Version: 0\n")  # fmt: skip
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return directory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayCluster:
    """A head and a second node; ``address`` for ``RAY_ADDRESS``, ``env`` for the driver."""

    address: str
    env: dict[str, str]
    log_dir: Path
    temp_dir: Path
    nodes: list[subprocess.Popen] = field(default_factory=list)

    def stop(self) -> None:
        """Kill every process of each node's session (its ``ray start`` and all that started:
        GCS, raylet, Ray's workers) until none is left; raise naming any that outlive it."""
        left = kill_sessions([proc.pid for proc in self.nodes])
        for proc in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)  # reap our two ``ray start`` (killed unless in ``left``)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if left:
            raise RuntimeError(f"Ray processes still running after the cluster's stop: {left}")


def start_cluster(workdir: Path) -> RayCluster:
    """Start the head and the second node (about 15 s); raise with their logs if either fails.

    Each node's environment is this process's, without our ``CONSTRAINED_*`` settings: what
    our processors see in a Ray worker comes from the driver through vLLM, as on two machines.
    """
    shim = write_platform_shim(workdir / "shim")
    pythonpath = os.pathsep.join([str(REPO), str(shim), os.environ.get("PYTHONPATH", "")])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSTRAINED_")}
    env.update(PYTHONPATH=pythonpath.rstrip(os.pathsep), RAY_USAGE_STATS_ENABLED="0",
               OMP_NUM_THREADS="1")  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # A short root: Ray's socket paths must fit in 107 characters.
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    common = ["--num-cpus=1", "--num-gpus=1", "--object-store-memory=100000000",
              "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]  # fmt: skip
    head = [RAY, "start", "--head", f"--port={port}", "--include-dashboard=false",
            f"--ray-client-server-port={_free_port()}", f"--temp-dir={temp}", *common]  # fmt: skip
    second = [RAY, "start", f"--address={address}", *common]
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = RayCluster(address=address, env={}, log_dir=workdir, temp_dir=temp)
    try:
        for name, cmd in (("head", head), ("second", second)):
            log = workdir / f"ray-{name}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
            cluster.nodes.append(proc)
            _wait_started(proc, log)
    except BaseException:
        cluster.stop()
        raise
    # The driver (vLLM's engine core) finds the cluster and the platform shim.
    cluster.env = {"RAY_ADDRESS": address, "PYTHONPATH": env["PYTHONPATH"],
                   "RAY_USAGE_STATS_ENABLED": "0", "VLLM_HOST_IP": "127.0.0.1"}  # fmt: skip
    return cluster


def _wait_started(proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "Ray runtime started" in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise RuntimeError(f"ray start failed ({' '.join(proc.args)}):\n{log.read_text()[-3000:]}")
