"""The shared wiring of samplers that keep an interval of each row's logits.

Top-n-sigma, typical-p and XTC each compute, per row, the logits ``[low, high]`` to keep
(``functional.top_n_sigma_bounds`` / ``typical_bounds`` / ``xtc_bounds``) and remove the
rest. ``TruncationProcessor`` holds what they share: one float column per request, greedy
requests left alone (as vLLM leaves them alone for ``top_p`` / ``min_p``), and how the mask
is applied, decided once when the processor is built:

- ``HostRowsMask`` (Model Runner V1 on CPU): the active rows are known on the host, so the
  bounds are computed 4 rows at a time (blocks that stay in cache instead of [rows, vocab]
  temporaries) and applied with one vectorized ``threshold_`` per row and side.
- ``TensorMask`` (V2, or any accelerator): bounds for every row at once (neutral for rows
  that do not use the sampler) and the mask in one Triton launch where Triton runs
  (``truncation_kernels.mask_outside_kernel``), else one ``masked_fill_`` per side: no host
  values, no sync.

All three run before temperature in both runners, like llama.cpp (declared not
argmax-invariant, so V1 runs them with the other pre-temperature processors, in
registration order, after the grammar mask: they never see a token the grammar forbids).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from constrained.options import Options
from constrained.processors.base import GREEDY_TEMPERATURE, DualInterfaceProcessor, Tokens
from constrained.processors.runners import Rows, triton_kernels_on
from constrained.processors.slots import Column
from constrained.processors.truncation_kernels import mask_outside_kernel
from constrained.processors.truncation_math import (
    NEG_INF,
    POS_INF,
    Scratch,
    host_kernel,
    mask_outside,
    mask_outside_rows,
    mask_outside_rows_native,
)

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

Bounds = tuple[torch.Tensor | None, torch.Tensor | None]


class TruncationProcessor(DualInterfaceProcessor):
    """A sampler that keeps an interval of each row's logits; subclasses give the bounds.

    Subclasses set ``OPTIONS``, ``PARAM`` (the option whose value is stored per slot) and
    ``NEUTRAL`` (its value in a slot that does not use the sampler), and implement
    ``bounds``.
    """

    PARAM: ClassVar[str]
    NEUTRAL: ClassVar[float]
    ROWS_PER_BLOCK = 4  # HostRowsMask: 4 x 151,936 float32 = 2.4 MB, cache-sized

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        # Decided once: where Triton compiles (V2 always, V1 on CUDA) the tensor mask is one
        # kernel, and a subclass may use its own kernels for the bounds (not under Triton's
        # CPU interpreter unless CONSTRAINED_TRUNCATION_KERNELS=1: settings.py).
        self.on_triton = triton_kernels_on(self.layout, on_v1=True)
        self.mask = HostRowsMask(self) if self.layout.host_reads_free else TensorMask(self)
        self.scratch = Scratch()  # host blocks' work buffers (HostRowsMask only)
        # HostRowsMask: the C kernels where they compile (one pass a row for the mask,
        # typical-p's search), else torch / NumPy (processors/host_kernels.py).
        self.host_kernel = host_kernel() if isinstance(self.mask, HostRowsMask) else None

    def columns(self) -> dict[str, Column]:
        return {self.PARAM: Column(torch.float32, self.NEUTRAL)}

    def is_argmax_invariant(self) -> bool:
        return False  # runs before temperature in V1 too, in registration order

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        value = self.value_of(options)
        if value is None or params.temperature < GREEDY_TEMPERATURE:
            return False
        extra = self.more_values(slot, options, params, tokens)
        self.slots.write(slot, **{self.PARAM: value}, **extra)
        return True

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        return self.mask.apply(logits, rows)

    # ---- what a subclass provides ------------------------------------------------------

    @abstractmethod
    def value_of(self, options: Options) -> float | None:
        """The request's value of ``PARAM``, or ``None`` when the sampler is off for it."""

    def more_values(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> dict:
        """Other columns to write for a new request (none by default)."""
        return {}

    @abstractmethod
    def bounds(
        self, logits: torch.Tensor, params: dict[str, torch.Tensor], on_host: bool
    ) -> Bounds:
        """Per-row ``(low, high)`` for ``logits``' rows, from each row's column values.

        ``on_host``: the logits are a CPU block whose values may be read on the host (often
        a view of the batch's rows: never written here)."""

    def native_for(self, logits: torch.Tensor) -> Any:
        """The C kernels if they can read ``logits`` (float32 rows, each contiguous), else
        ``None``."""
        if logits.stride(1) != 1 or logits.dtype != torch.float32:
            return None
        return self.host_kernel

    def mask_block(self, block: torch.Tensor, params: dict[str, torch.Tensor]) -> bool:
        """V1 on CPU: find and apply the bounds of ``block`` (consecutive rows of the batch's
        logits: a view, written in place) in one go; ``False`` where this sampler has no
        such path (then ``bounds`` and the mask run apart)."""
        return False

    def row_params(self, rows: Rows, on_host: bool) -> dict[str, torch.Tensor]:
        """Per-row device values of every column for this call's rows (``on_host``: for
        ``HostRowsMask``, which selected its rows on the host already)."""
        return {name: self.slots.gather(name, rows) for name in self.slots.columns}

    def host_rows(self, rows: Rows, active: np.ndarray) -> np.ndarray:
        """V1 on CPU: of the active rows, those to edit this step (all, by default)."""
        return active


class TensorMask:
    """Every row at once, neutral bounds for rows that do not use the sampler; no host reads."""

    def __init__(self, processor: TruncationProcessor) -> None:
        self.processor = processor
        self.mask_outside = mask_outside_kernel if processor.on_triton else mask_outside

    def apply(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        low, high = self.processor.bounds(logits, self.processor.row_params(rows, False), False)
        return self.mask_outside(logits, low, high)


class HostRowsMask:
    """Model Runner V1 on CPU: only the rows that use the sampler, a few at a time."""

    def __init__(self, processor: TruncationProcessor) -> None:
        self.processor = processor

    def apply(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        processor = self.processor
        active = np.flatnonzero(processor.slots.active[: rows.count])
        selected = processor.host_rows(rows, active)
        if selected.size == 0:
            return logits
        params = processor.row_params(rows, True)
        step = processor.ROWS_PER_BLOCK
        for start in range(0, selected.size, step):
            block = selected[start : start + step].tolist()
            index = torch.tensor(block, dtype=torch.long)
            first, last = block[0], block[-1]
            block_params = {k: v[index] for k, v in params.items()}
            # consecutive rows (the usual case): a view, not a copy; bounds never write it
            consecutive = last - first + 1 == len(block)
            if consecutive and processor.mask_block(logits[first : last + 1], block_params):
                continue
            rows_block = logits[first : last + 1] if consecutive else logits.index_select(0, index)
            low, high = processor.bounds(rows_block, block_params, True)
            kernel = processor.native_for(logits)
            if kernel is not None:
                low = torch.full((len(block),), NEG_INF) if low is None else low
                high = torch.full((len(block),), POS_INF) if high is None else high
                mask_outside_rows_native(logits, block, low, high, kernel)
                continue
            mask_outside_rows(
                logits,
                block,
                None if low is None else low.tolist(),
                None if high is None else high.tolist(),
            )
        return logits
