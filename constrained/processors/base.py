"""One processor class that speaks both of vLLM's logits-processor interfaces.

Model Runner V1 (the CPU build, and GPU with ``VLLM_USE_V2_MODEL_RUNNER=0``) builds processors
as ``cls(vllm_config, device, is_pin_memory)`` and drives them with ``update_state`` and
``apply(logits)``. Model Runner V2 (GPU, vLLM 0.32+) builds ``cls(vllm_config, req_states)``
and drives ``add_request``, ``apply_staged_writes`` and ``apply(logits, ctx)``. A subclass of
both ABCs passes both loaders' checks, so one registration list works on every runner, and
the subclasses only implement the slot-level hooks below.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm.logger import init_logger
from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor.interface import LogitsProcessor as V1LogitsProcessor

from constrained.options import OptionError, Options, options_from_params
from constrained.processors.slots import SlotTable
from constrained.processors.stats import REPORTER

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

# V1's (prompt_ids, output_ids) for an added request; None under V2.
Tokens = tuple[Sequence[int], list[int]] | None


class DualInterfaceProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Shared adapter: routes both interfaces to slot-level hooks over a ``SlotTable``.

    Subclasses define ``columns()``, ``fill_slot()`` and ``apply_rows()``.
    """

    def __init__(self, vllm_config: VllmConfig, *runner_args: Any) -> None:
        if len(runner_args) == 2:  # V1: (device, is_pin_memory)
            device, _ = runner_args
            capacity = vllm_config.scheduler_config.max_num_seqs
            self.logits_width = vllm_config.model_config.get_vocab_size()
            self.runner = "v1"
        else:  # V2: (req_states,)
            (req_states,) = runner_args
            device, capacity = req_states.device, req_states.max_num_reqs
            self.logits_width = req_states.vocab_size
            self.req_states = req_states
            self.runner = "v2"
        self.vllm_config = vllm_config
        self.slots = SlotTable(capacity, device, self.columns())
        self.slots.flush()
        REPORTER.register(self)

    # ---- what a subclass provides ------------------------------------------------------

    @classmethod
    @abstractmethod
    def columns(cls) -> dict:
        """The per-slot columns this processor keeps (see ``SlotTable``)."""

    @abstractmethod
    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        """Write the slot's row for a request; return False when nothing applies to it.

        ``tokens`` is V1's ``(prompt_ids, output_ids)`` (the output list grows in place), or
        ``None`` under V2, where token history lives on the device in ``req_states``.
        """

    @abstractmethod
    def apply_rows(
        self, logits: torch.Tensor, row_slots: torch.Tensor | None, ctx: Any = None
    ) -> torch.Tensor:
        """Edit ``logits`` in place; ``row_slots`` maps rows to slots (``None``: identity).

        ``ctx`` is V2's ``LogitsContext`` (``None`` under V1).
        """

    # ---- admission (frontend process) --------------------------------------------------

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        options_from_params(sampling_params, logits_width=_frontend_logits_width())

    # ---- shared slot bookkeeping -------------------------------------------------------

    def _add(self, slot: int, params: SamplingParams, tokens: Tokens = None) -> bool:
        try:
            options = options_from_params(params, logits_width=self.logits_width)
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
        if ctx is None:  # V1: rows are the first batch-size slots
            if not self.slots.any_active():
                return logits
            return self.apply_rows(logits, None)
        # V2: skip on the host when no request of this step uses us (no device sync).
        if not self.slots.any_active(ctx.idx_mapping_np):
            return logits
        return self.apply_rows(logits, ctx.expanded_idx_mapping, ctx)


def _frontend_logits_width() -> int | None:
    """The served model's logits width, from vLLM's input processor on the call stack.

    ``None`` when not found (then the engine-side check refuses out-of-range ids when the
    request is added).
    """
    model_config = _frontend_model_config()
    return int(model_config.get_vocab_size()) if model_config is not None else None


def _frontend_model_config() -> Any:
    """The served model's ``ModelConfig``, read from vLLM's input processor on the stack.

    ``validate_params`` is a classmethod called at admission with only the request's
    parameters; the model config lives on the ``InputProcessor`` that calls it.
    """
    frame = inspect.currentframe()
    try:
        for _ in range(12):
            frame = frame.f_back if frame else None
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            model_config = getattr(owner, "model_config", None)
            if model_config is not None and hasattr(model_config, "get_vocab_size"):
                return model_config
        return None
    finally:
        del frame
