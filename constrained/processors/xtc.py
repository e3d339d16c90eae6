"""``xtc_probability`` / ``xtc_threshold``: XTC, "exclude top choices"."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from constrained.options import Options
from constrained.processors.base import Tokens
from constrained.processors.runners import Rows
from constrained.processors.slots import Column
from constrained.processors.truncation import Bounds, TruncationProcessor
from constrained.processors.truncation_kernels import xtc_kernel
from constrained.processors.truncation_math import uniform_hash, xtc_bounds, xtc_bounds_on_host

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

DEFAULT_THRESHOLD = 0.1  # llama.cpp's default xtc_threshold


class XtcProcessor(TruncationProcessor):
    """XTC (llama.cpp's ``xtc``): sometimes remove the most likely tokens.

    With probability ``xtc_probability`` per step, when two or more tokens have
    ``p >= xtc_threshold`` (``p = softmax(l)``, before temperature), all of them but the
    least likely are removed. Greedy requests are left alone.

    The per-step draw is ``functional.uniform_hash(seed, position)``, keyed on the request's
    ``seed`` and the position of the token being sampled: a seeded request draws the same
    sequence in any batch, after preemption, under either model runner and on every rank
    (vLLM does not hand logits processors its per-request generators). Unseeded requests
    get seeds from a counter started at the engine's seed, identical on every rank.

    Example::

        SamplingParams(temperature=1.0, seed=7,
                       extra_args={"xtc_probability": 0.5, "xtc_threshold": 0.1})
    """

    OPTIONS = frozenset({"xtc_probability", "xtc_threshold"})
    PARAM = "xtc_probability"
    NEUTRAL = 0.0

    def __init__(self, vllm_config: Any, *runner_args: Any) -> None:
        super().__init__(vllm_config, *runner_args)
        engine_seed = getattr(getattr(vllm_config, "model_config", None), "seed", None) or 0
        self._unseeded = itertools.count(_seed32(engine_seed) << 20)
        # V1: each request's (prompt length, live output list); V2 reads ctx.pos instead.
        self.position_of = self.layout.pick(self._v1_positions, _v2_positions)
        # V2 where Triton runs: the draw, the bound and the mask in one kernel's four passes.
        self.own_kernel = self.layout.pick(False, self.on_triton)

    def columns(self) -> dict[str, Column]:
        return {
            **super().columns(),
            "xtc_threshold": Column(torch.float32, DEFAULT_THRESHOLD),
            "seed": Column(torch.int64, 0),
        }

    def value_of(self, options: Options) -> float | None:
        return options.xtc_probability or None

    def more_values(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> dict:
        seed = params.seed if params.seed is not None else next(self._unseeded)
        threshold = options.xtc_threshold
        return {
            "xtc_threshold": DEFAULT_THRESHOLD if threshold is None else threshold,
            "seed": _seed32(seed),
        }

    def fill_slot(
        self, slot: int, options: Options, params: SamplingParams, tokens: Tokens
    ) -> bool:
        if not super().fill_slot(slot, options, params, tokens):
            return False
        if tokens is not None:  # V1: positions come from the request's own lists
            self.slots.payload[slot] = (len(tokens[0]), tokens[1])
        return True

    def apply_rows(self, logits: torch.Tensor, rows: Rows) -> torch.Tensor:
        if not self.own_kernel:
            return super().apply_rows(logits, rows)
        tables = self.slots.device_tables
        return xtc_kernel(
            logits,
            rows.slots,
            rows.ctx.pos,
            tables[self.PARAM],
            tables["xtc_threshold"],
            tables["seed"],
        )

    def row_params(self, rows: Rows, on_host: bool) -> dict[str, torch.Tensor]:
        params = super().row_params(rows, on_host)
        if not on_host:  # TensorMask: this step's draws, on the device
            position = self.position_of(rows)
            params["apply"] = uniform_hash(params["seed"], position) < params[self.PARAM]
        return params  # HostRowsMask drew on the host already (host_rows)

    def host_rows(self, rows: Rows, active: np.ndarray) -> np.ndarray:
        """V1 on CPU: only the rows whose draw says XTC applies this step."""
        if active.size == 0:
            return active
        index = torch.from_numpy(active)
        seed = self.slots.host["seed"][index]
        probability = self.slots.host[self.PARAM][index]
        position = torch.tensor(self._positions(active.tolist()), dtype=torch.int64)
        return active[(uniform_hash(seed, position) < probability).numpy()]

    def _positions(self, slots: list[int]) -> list[int]:
        # V1 keeps token history in host lists; the position of the token being sampled is
        # the sequence length (prompt + output so far), read per row: host data either way.
        payload = self.slots.payload
        return [payload[s][0] + len(payload[s][1]) for s in slots]

    def _v1_positions(self, rows: Rows) -> torch.Tensor:
        positions = np.zeros(rows.count, dtype=np.int64)
        active = np.flatnonzero(self.slots.active[: rows.count])
        positions[active] = self._positions(active.tolist())
        return torch.from_numpy(positions).to(self.layout.device, non_blocking=True)

    def bounds(
        self, logits: torch.Tensor, params: dict[str, torch.Tensor], on_host: bool
    ) -> Bounds:
        if on_host:  # HostRowsMask passes only the rows whose draw applies this step
            return xtc_bounds_on_host(logits, params["xtc_threshold"], self.scratch)
        return xtc_bounds(logits, params["xtc_threshold"], params["apply"])


def _v2_positions(rows: Rows) -> torch.Tensor:
    # ctx.pos is each row's input position; the token being sampled comes one after it.
    return rows.ctx.pos.long() + 1


def _seed32(seed: int) -> int:
    """Fold any Python int seed into [0, 2**32)."""
    folded = seed % (1 << 64)
    return (folded ^ (folded >> 32)) & 0xFFFFFFFF
