"""Per-slot state shared by the V1 and V2 adapters.

A *slot* is where a request's state lives: the persistent-batch index under Model Runner V1
(requests move between indices, so state moves with them) and the request-state slot under
V2 (fixed for the request's life, recycled without notice). ``SlotTable`` keeps small
per-slot tensors on the host, where requests are added, and mirrors them to the device in one
copy per step, only when something changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from constrained.processors.runners import Rows
from constrained.processors.transfer import Uploader


@dataclass(frozen=True)
class Column:
    """One per-slot field: ``shape`` after the slot dimension, and the value of an empty slot."""

    dtype: torch.dtype
    fill: float | int
    width: int | None = None  # None: one value per slot; else a growable row of values


class SlotTable:
    """Named ``[capacity]`` or ``[capacity, width]`` host tensors, mirrored to ``device``.

    Rows are written on the host (``write``/``clear``/``move``/``swap``); ``flush`` copies the
    whole table to the device when dirty. Tables are small (a few values per slot), so one
    bulk copy beats tracking which rows changed.
    """

    def __init__(self, capacity: int, device: torch.device, columns: dict[str, Column]) -> None:
        self.capacity = capacity
        self.device = torch.device(device)
        self.columns = columns
        self.host: dict[str, torch.Tensor] = {
            name: self._empty(col) for name, col in columns.items()
        }
        # numpy views of the one-value-per-slot host columns (same memory): host reads that
        # are not torch calls, so a step may consult them without touching any tensor.
        self.host_values: dict[str, np.ndarray] = {
            name: table.numpy() for name, table in self.host.items() if columns[name].width is None
        }
        self.active = np.zeros(capacity, dtype=bool)
        # How many slots are active (kept by every edit below): with none, every row holds its
        # columns' fill values and no payload, so a step may skip the table (O(1) check).
        self.num_active = 0
        # Host-only per-slot objects (e.g. a request's token history), moved with their rows.
        self.payload: list[Any] = [None] * capacity
        self._uploader = Uploader(self.device)
        self.device_tables: dict[str, torch.Tensor] = {}  # the device mirror of ``host``
        self._dirty = True

    def _empty(self, col: Column, width: int | None = None) -> torch.Tensor:
        shape = (self.capacity,) if col.width is None else (self.capacity, width or col.width)
        return torch.full(shape, col.fill, dtype=col.dtype)

    # ---- host-side row edits -----------------------------------------------------------

    def write(self, slot: int, **values: torch.Tensor | float | int) -> None:
        """Set a slot's fields (unnamed fields are reset) and mark it active."""
        self.clear(slot)
        for name, value in values.items():
            col, table = self.columns[name], self.host[name]
            if col.width is None:
                table[slot] = value
                continue
            value = torch.as_tensor(value, dtype=col.dtype)
            self._ensure_width(value.numel())
            self.host[name][slot, : value.numel()] = value
        self.active[slot] = True
        self.num_active += 1  # cleared just above

    def clear(self, slot: int) -> None:
        for name, col in self.columns.items():
            self.host[name][slot] = col.fill
        if self.active[slot]:
            self.active[slot] = False
            self.num_active -= 1
        self.payload[slot] = None
        self._dirty = True

    def move(self, src: int, dst: int) -> None:
        for table in self.host.values():
            table[dst] = table[src]
        moving = bool(self.active[src])
        self.num_active -= int(self.active[dst])  # dst's own request (if any) is overwritten
        self.active[dst] = moving
        self.num_active += int(moving)  # the clear of src below takes it off again
        payload = self.payload[src]
        self.clear(src)
        self.payload[dst] = payload

    def swap(self, a: int, b: int) -> None:
        idx = torch.tensor([a, b])
        for table in self.host.values():
            table[idx] = table[idx.flip(0)]
        self.active[[a, b]] = self.active[[b, a]]
        self.payload[a], self.payload[b] = self.payload[b], self.payload[a]
        self._dirty = True

    def scatter(
        self, name: str, slots: list[int], cols: list[int], values: list[int], add: bool
    ) -> None:
        """Batched element writes into a growable column: ``table[slot, col] (+)= value``."""
        if not slots:
            return
        self._ensure_width(max(cols) + 1)
        table = self.host[name]
        index = (torch.tensor(slots), torch.tensor(cols))
        table.index_put_(index, torch.tensor(values, dtype=table.dtype), accumulate=add)
        self._dirty = True

    def assign(self, name: str, slots: list[int], values: list[int | float]) -> None:
        """Batched writes into a one-value-per-slot column: ``table[slot] = value``."""
        if slots:
            table = self.host[name]
            table[torch.tensor(slots)] = torch.tensor(values, dtype=table.dtype)
            self._dirty = True

    def _ensure_width(self, width: int) -> None:
        # Double to keep regrowth rare; new cells hold each column's neutral fill value.
        for name, col in self.columns.items():
            old = self.host[name]
            if col.width is None or width <= old.shape[1]:
                continue
            new = self._empty(col, max(width, 2 * old.shape[1]))
            new[:, : old.shape[1]] = old
            self.host[name] = new
            self._dirty = True

    # ---- device side -------------------------------------------------------------------

    def flush(self) -> None:
        """Mirror the host tables to the device if anything changed since the last flush.

        On an accelerator the copy goes through pinned staging buffers, non-blocking
        (``transfer.Uploader``), so host edits may follow at once.
        """
        if not self._dirty:
            return
        self._dirty = False
        self.device_tables = self._uploader.upload(self.host)

    def gather(self, name: str, rows: Rows) -> torch.Tensor:
        """Device values of ``name`` for each of an apply call's logits rows."""
        return self.rows(name, rows.slots, rows.count)

    def rows(self, name: str, row_slots: torch.Tensor | None, num_rows: int) -> torch.Tensor:
        """Device values of ``name`` for each logits row.

        ``row_slots`` maps rows to slots (V2); ``None`` means row ``i`` is slot ``i`` (V1).
        """
        table = self.device_tables[name]
        return table[:num_rows] if row_slots is None else table[row_slots]

    def any_active(self, slots: np.ndarray | None = None) -> bool:
        """Whether any of ``slots`` (default: all) holds an active request; host only."""
        if not self.num_active:
            return False
        return bool(self.active.any() if slots is None else self.active[slots].any())
