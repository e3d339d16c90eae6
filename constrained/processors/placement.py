"""Where in a parallel engine a processor runs, decided once when it is built.

vLLM builds one set of processors per worker. Under tensor parallelism every rank computes the
full logits (all-gathered) and samples them itself, so every rank must apply our processors
identically; they do, because each rank sees the same requests, the same batch updates and the
same logits, and no draw depends on the rank (XTC hashes the request's seed and position; an
unseeded request's seed comes from a counter every rank advances alike). Under pipeline
parallelism only the last stage computes logits and samples (unless the engine runs under an
external launcher, which broadcasts logits to every stage); the other stages still receive
batch updates, so a processor there would compile grammars and track tokens for nothing.
Each data-parallel engine has its own workers and requests.

``placement_of`` reads this from vLLM's parallel state; ``Placement.samples`` is what a
processor checks (``DualInterfaceProcessor`` stays inert where it is False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    """One worker's ranks and whether it samples.

    Attributes:
        tp_rank, pp_rank: the worker's rank in its tensor- and pipeline-parallel groups.
        dp_index: the data-parallel engine it belongs to (vLLM's ``data_parallel_index``,
            set for dense models too). vLLM reconfigures each engine of a dense model as a
            lone engine, so engine 0 of those cannot tell it has siblings: it looks alone.
        parallel: True when the engine has more than one worker or there are several
            data-parallel engines.
        samples: True when this worker's sampler runs, so its processors get ``apply``.
    """

    tp_rank: int = 0
    pp_rank: int = 0
    dp_index: int = 0
    parallel: bool = False
    samples: bool = True

    @property
    def tag(self) -> str:
        """``dp0-pp1-tp0`` style name for files written per worker; empty when alone."""
        return f"dp{self.dp_index}-pp{self.pp_rank}-tp{self.tp_rank}" if self.parallel else ""


def placement_of(vllm_config: Any) -> Placement:
    """This worker's placement; a lone worker (and tests with no distributed state) gets the
    default ``Placement()``."""
    pc = getattr(vllm_config, "parallel_config", None)
    if pc is None:
        return Placement()
    tp, pp = int(pc.tensor_parallel_size), int(pc.pipeline_parallel_size)
    dp_index = int(getattr(pc, "data_parallel_index", 0) or 0)
    dp_engines = int(getattr(pc, "data_parallel_size", 1) or 1) > 1 or dp_index > 0
    if tp == 1 and pp == 1:
        return Placement(dp_index=dp_index, parallel=dp_engines)
    from vllm.distributed import parallel_state

    pp_group = parallel_state.get_pp_group()
    # vLLM's V1 runner broadcasts logits to every stage only under the external launcher
    # (gpu_model_runner's ``broadcast_pp_output``); otherwise only the last stage samples.
    broadcast = pc.distributed_executor_backend == "external_launcher"
    return Placement(
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=pp_group.rank_in_group,
        dp_index=dp_index,
        parallel=True,
        samples=broadcast or pp_group.is_last_rank,
    )
