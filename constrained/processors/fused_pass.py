"""Under Model Runner V2, one elementwise pass over the logits for logit bias, penalties and
min-p (``penalty_kernel.apply_fused_elementwise``): at most three launches for the three,
as vLLM's own take for its built-ins.

Every processor a V2 runner builds registers with the runner's ``FusedPass`` as it is built,
in application order; the pass decides once who does what:

- the penalties processor runs the pass, and with it the bias of a ``LogitBiasProcessor``
  built just before it (which then does nothing itself);
- and the min-p of a ``MinPProcessor`` built after it, for a call where none of our
  processors between the two has a row (min-p runs last of ours, so the result is the
  same), when every processor the engine is configured with is ours (no foreign processor
  can run between them); that min-p then does nothing for the call.

No processor reads or writes another's attributes: each asks the pass (``skips_bias``,
``runs``, ``skips_min_p``). Under V1 nothing fuses: each processor has a pass of its own. With
several penalties processors in one runner (ours registered twice), the last one built runs
the pass.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from constrained.processors.runners import Rows

# A runner's pass, by the id of its request state (one per V2 model runner; it may not be
# hashable), held with a weak reference to it: a pass dies with its runner.
_PASSES: dict[int, tuple[weakref.ref, FusedPass]] = {}


def fused_pass_for(layout: Any, vllm_config: Any) -> FusedPass | None:
    """The ``FusedPass`` of the V2 runner that built ``layout``; ``None`` under V1."""
    owner = layout.req_states
    if owner is None:
        return None
    for key in [k for k, (ref, _) in _PASSES.items() if ref() is None]:
        del _PASSES[key]
    entry = _PASSES.get(id(owner))
    if entry is None or entry[0]() is not owner:
        entry = _PASSES[id(owner)] = (
            weakref.ref(owner),
            FusedPass(only_ours_configured(vllm_config)),
        )
    return entry[1]


class FusedPass:
    """One V2 runner's fused bias + penalties + min-p pass (see the module docstring)."""

    def __init__(self, only_ours: bool) -> None:
        self.only_ours = only_ours
        self._built: list[weakref.ref] = []  # the runner's processors, in build order
        self._bias: weakref.ref | None = None
        self._penalties: weakref.ref | None = None
        self._min_p: weakref.ref | None = None
        self._between: list[weakref.ref] = []  # ours between the penalties and min-p
        self._min_p_done_for: Any = None  # the V2 call whose min-p the pass applied

    def register(self, proc: Any) -> None:
        """``proc`` was just built (``DualInterfaceProcessor.__init__``)."""
        built = [p for p in (ref() for ref in self._built) if p is not None]
        if proc.FUSES == "penalties":
            before = built[-1] if built else None
            fuses_bias = before is not None and before.FUSES == "bias"
            self._bias = weakref.ref(before) if fuses_bias else None
            self._penalties = weakref.ref(proc)
            self._min_p, self._between = None, []
        elif proc.FUSES == "min_p" and self.only_ours and self._penalties is not None:
            owner = self._penalties()
            at = next((i for i, p in enumerate(built) if p is owner), None)
            if at is not None:
                self._min_p = weakref.ref(proc)
                self._between = [weakref.ref(p) for p in built[at + 1 :]]
        self._built.append(weakref.ref(proc))

    # ---- what each fused processor asks ----------------------------------------------------

    def skips_bias(self, proc: Any) -> bool:
        """Whether ``proc``'s bias is applied by the penalties' pass."""
        return self._bias is not None and self._bias() is proc

    def runs(self, proc: Any) -> bool:
        """Whether ``proc`` (a penalties processor) runs the pass."""
        return self._penalties is not None and self._penalties() is proc

    def skips_min_p(self, proc: Any, ctx: Any) -> bool:
        """Whether the pass applied ``proc``'s min-p in this call."""
        return self._min_p is not None and self._min_p() is proc and self._min_p_done_for is ctx

    # ---- the pass --------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The rows of this call that need it: the bias, the penalties and (see the module
        docstring) min-p, in at most three launches; skipped parts cost none."""
        penalties = self._penalties()
        bias = self._bias() if self._bias is not None else None
        min_p = self._min_p() if self._min_p is not None else None
        with_bias = bias is not None and bias.uses_rows(ctx)
        with_penalties = penalties.uses_rows(ctx)
        with_min_p = (
            min_p is not None
            and min_p.uses_rows(ctx)
            and not any(p is not None and p.uses_rows(ctx) for p in (r() for r in self._between))
        )
        self._min_p_done_for = ctx if with_min_p else None
        if not (with_bias or with_penalties or with_min_p):
            return logits
        rows = Rows(logits.shape[0], ctx.expanded_idx_mapping, ctx)
        return penalties.counts.apply(
            logits,
            rows,
            penalties=with_penalties,
            bias=bias.tables() if with_bias else None,
            log_min_p=min_p.slots.device_tables["log_min_p"] if with_min_p else None,
        )


def only_ours_configured(vllm_config: Any) -> bool:
    """Whether no foreign processor can run between our penalties and min-p: every class the
    engine's flag names is ours (vLLM builds entry-point plugins first, before the flag's),
    or, without a flag, every ``vllm.logits_processors`` entry point is ours."""
    model_config = getattr(vllm_config, "model_config", None)
    names = list(getattr(model_config, "logits_processors", None) or ())
    if not names:
        from importlib.metadata import entry_points

        names = [ep.value for ep in entry_points(group="vllm.logits_processors")]
    for entry in names:
        name = entry if isinstance(entry, str) else f"{entry.__module__}.{entry.__qualname__}"
        if not name.startswith("constrained."):
            return False
    return True
