"""The vLLM adapter every processor shares: one class that speaks both logits-processor APIs.

Model Runner V1 (the usual CPU build, and GPU with ``VLLM_USE_V2_MODEL_RUNNER=0``) drives
processors with ``update_state(BatchUpdate)`` and ``apply(logits)``. Model Runner V2 (GPU, vLLM
0.32+) drives ``add_request``, ``apply_staged_writes`` and ``apply(logits, ctx)``. A subclass of
both ABCs passes both loaders' checks, so one registration list works on every runner. The
runner's layout (``runners.py``) is decided once, in ``__init__``; subclasses implement only
the slot-level hooks below and choose their own runner-specific parts with ``layout.pick``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.logger import init_logger
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor.interface import LogitsProcessor as V1LogitsProcessor

from constrained.admission import validate_at_admission
from constrained.options import OptionError, Options
from constrained.processors.fused_pass import fused_pass_for
from constrained.processors.runners import Rows, layout_for
from constrained.processors.slots import Column, SlotTable
from constrained.processors.stats import REPORTER
from constrained.request_options import options_for_engine, uses_our_options

try:  # vLLM 0.32+; older releases have only the V1 interface.
    from vllm.v1.worker.gpu.sample.logits_processor.interface import (
        LogitsProcessor as V2LogitsProcessor,
    )
except ImportError:  # pragma: no cover - depends on the installed vLLM

    class V2LogitsProcessor:  # type: ignore[no-redef]
        """Stand-in so the class hierarchy stays the same without V2."""


logger = init_logger(__name__)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams

# vLLM treats temperatures below this as greedy (vllm.sampling_params._SAMPLING_EPS).
GREEDY_TEMPERATURE = 1e-5

# V1's (prompt_ids, output_ids) for an added request; None under V2.
Tokens = tuple[Sequence[int], list[int]] | None


class DualInterfaceProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Shared adapter: routes both interfaces to slot-level hooks over a ``SlotTable``.

    Subclasses define ``OPTIONS``, ``columns()``, ``fill_slot()`` and ``apply_rows()``.
    """

    # The per-request options this processor applies. Admission refuses a request that sets
    # an option no registered processor applies, so an option is never silently dropped.
    OPTIONS: ClassVar[frozenset[str]] = frozenset()
    # Its part in the V2 fused pass ("bias", "penalties", "min_p": fused_pass.py), if any.
    FUSES: ClassVar[str | None] = None

    def __init__(self, vllm_config: VllmConfig, *runner_args: Any) -> None:
        self.vllm_config = vllm_config
        self.layout = layout_for(vllm_config, runner_args)
        # False on a pipeline stage that never samples: the processor then ignores every
        # request (no compiles, no token tracking) and is never applied (placement.py).
        self.samples_here = self.layout.placement.samples
        self.logits_width = self.layout.logits_width
        self.slots = SlotTable(self.layout.capacity, self.layout.device, self.columns())
        self.slots.flush()
        # Under V2, the runner's one pass for bias, penalties and min-p (fused_pass.py), which
        # every processor joins as it is built, in application order; None under V1.
        self.fused = fused_pass_for(self.layout, vllm_config)
        if self.fused is not None:
            self.fused.register(self)
        REPORTER.register(self, self.layout.placement.tag)

    # ---- what a subclass provides ------------------------------------------------------

    @abstractmethod
    def columns(self) -> dict[str, Column]:
        """The per-slot columns this processor keeps (see ``SlotTable``); ``self.layout`` is
        already set."""

    @abstractmethod
    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        """Write the slot's row for a request; return False when nothing applies to it.

        ``tokens`` is V1's ``(prompt_ids, output_ids)`` (the output list grows in place), or
        ``None`` under V2, where token history lives on the device in ``req_states``.
        """

    @abstractmethod
    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Edit ``logits`` in place for this call's ``rows`` (at least one row is ours)."""

    # ---- admission (frontend process) --------------------------------------------------

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Admit or refuse a request (vLLM's frontend calls this once per registered class;
        the first call admits, the others answer from its outcome: ``validate_at_admission``).
        """
        validate_at_admission(sampling_params)

    # ---- shared slot bookkeeping -------------------------------------------------------

    def _add(self, slot: int, params: SamplingParams, tokens: Tokens = None) -> bool:
        if not self.samples_here:
            return False
        if not uses_our_options(getattr(params, "extra_args", None)):  # none of ours
            if self.slots.active[slot]:  # (nor any admission routed there): nothing to
                self.slots.clear(slot)  # parse or write; an inactive row is all fill values
            return False
        try:
            options = options_for_engine(params, self.logits_width)
        except OptionError as exc:
            # Admission refuses these; raising here would take the whole engine down.
            logger.error("%s; request admitted without validation, options not applied", exc)
            options = None
        if options is None or not self.fill_slot(slot, options, params, tokens):
            self.slots.clear(slot)
            return False
        return True

    # ---- Model Runner V1 ---------------------------------------------------------------

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        if self.samples_here and not self.slots.num_active and not _any_options(batch_update):
            # Nothing of ours in the batch, before or after: every row (removed, moved or
            # added without options) holds its fill values already. O(1) but for the scan
            # of the added requests' extra_args.
            REPORTER.tick()
            return
        if self.samples_here:
            for slot in batch_update.removed:
                self.slots.clear(slot)
            for slot, params, prompt_ids, output_ids in batch_update.added:
                self._add(slot, params, (prompt_ids or [], output_ids))
            for src, dst, direction in batch_update.moved:
                if direction == MoveDirectionality.SWAP:
                    self.slots.swap(src, dst)
                else:
                    self.slots.move(src, dst)
            self.slots.flush()
        REPORTER.tick()

    # ---- Model Runner V2 ---------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        return self._add(req_idx, sampling_params)

    def apply_staged_writes(self) -> None:
        self.slots.flush()
        REPORTER.tick()

    # ---- both --------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if not self.slots.num_active:
            return logits  # no request uses the processor: no tensor op
        rows = self.layout.rows(self.slots.active, logits, ctx)
        return logits if rows is None else self.apply_rows(logits, rows)

    def uses_rows(self, ctx: Any) -> bool:
        """Whether any request of this V2 call uses the processor (host only, no sync)."""
        return self.slots.any_active(ctx.idx_mapping_np)


def _any_options(batch_update: BatchUpdate) -> bool:
    """Whether a request added by this V1 batch update may set an option of ours."""
    return any(uses_our_options(getattr(a[1], "extra_args", None)) for a in batch_update.added)
