"""vLLM's two model runners, as seen by a processor: decided once, when the processor is built.

Model Runner V1 builds processors as ``cls(vllm_config, device, is_pin_memory)``; a request's
*slot* is its persistent-batch index, and logits row ``i`` is slot ``i``. Model Runner V2
builds them as ``cls(vllm_config, req_states)``; a slot is the request-state slot, and logits
rows map to slots through ``ctx.expanded_idx_mapping`` (speculative drafts add rows).

``layout_for`` returns a ``V1Layout`` or a ``V2Layout``; everything a processor does
differently under the two runners is chosen from it once, with ``layout.pick(v1, v2)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from vllm.triton_utils import HAS_TRITON

from constrained.processors.placement import placement_of
from constrained.settings import settings

T = TypeVar("T")


@dataclass(frozen=True)
class Rows:
    """The logits rows of one ``apply`` call.

    Attributes:
        count: number of logits rows.
        slots: [count] device tensor, the slot of each row; ``None`` when row ``i`` is slot
            ``i`` (V1).
        ctx: V2's ``LogitsContext`` (row layout, fed tokens, positions); ``None`` under V1.
    """

    count: int
    slots: torch.Tensor | None
    ctx: Any = None


class V1Layout:
    """Model Runner V1: slots are persistent-batch indices, state moves with requests."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        self.capacity = int(vllm_config.scheduler_config.max_num_seqs)
        self.logits_width = int(vllm_config.model_config.get_vocab_size())
        self.req_states = None
        self.placement = placement_of(vllm_config)
        # On CPU a "device" value is a host value: reading one costs no sync, so a processor
        # may branch on it (skip work, stop a loop early). Never under V2 (the GPU runner).
        self.host_reads_free = self.device.type == "cpu"

    @staticmethod
    def pick(v1: T, v2: T) -> T:
        return v1

    def rows(self, active: Any, logits: torch.Tensor, ctx: Any) -> Rows | None:
        """This call's rows, or ``None`` when no request in the batch uses the processor."""
        if not active.any():
            return None
        return Rows(logits.shape[0], None)


class V2Layout:
    """Model Runner V2: fixed request-state slots; token history on the device."""

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        self.device = torch.device(req_states.device)
        self.capacity = int(req_states.max_num_reqs)
        self.logits_width = int(req_states.vocab_size)
        self.req_states = req_states
        self.placement = placement_of(vllm_config)
        self.host_reads_free = False

    @staticmethod
    def pick(v1: T, v2: T) -> T:
        return v2

    def rows(self, active: Any, logits: torch.Tensor, ctx: Any) -> Rows | None:
        """This call's rows, or ``None`` when none of its requests uses the processor
        (decided on the host from ``ctx.idx_mapping_np``: no device sync)."""
        if not active[ctx.idx_mapping_np].any():
            return None
        return Rows(logits.shape[0], ctx.expanded_idx_mapping, ctx)


Layout = V1Layout | V2Layout


def layout_for(vllm_config: Any, runner_args: tuple) -> Layout:
    """The layout of the runner that is building the processor, from its constructor's
    arguments: V2 passes the request state (it has ``all_token_ids``), V1 a device and a flag."""
    if len(runner_args) == 1 and hasattr(runner_args[0], "all_token_ids"):
        return V2Layout(vllm_config, runner_args[0])
    if len(runner_args) == 2:
        return V1Layout(vllm_config, *runner_args)
    raise TypeError(
        f"constrained: unknown logits-processor constructor arguments {runner_args!r}: "
        "expected V1's (device, is_pin_memory) or V2's (req_states)"
    )


def triton_kernels_on(layout: Layout, on_v1: bool) -> bool:
    """Whether a processor runs its own Triton kernels, decided once when it is built.

    Where Triton compiles: Model Runner V2 always, V1 on CUDA only where ``on_v1`` (the
    truncation samplers; no-repeat-ngram and XTC's own kernels read V2's request state). Not
    under Triton's CPU interpreter (the V2 tests), where a vocabulary-wide pass costs seconds,
    unless ``CONSTRAINED_TRUNCATION_KERNELS=1`` forces them (``0``: never; ``settings.py``).

    Example: ``triton_kernels_on(V2Layout(...), on_v1=False)`` is True on a GPU.
    """
    on = HAS_TRITON and layout.pick(on_v1 and layout.device.type == "cuda", True)
    forced = settings().truncation_kernels
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's own switch
    return on and ((not interpreted) if forced is None else forced)
