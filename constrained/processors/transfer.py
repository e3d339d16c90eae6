"""Host <-> device copies for the processors: pinned staging, non-blocking, at most one sync.

On a CPU device nothing is copied (the host tensor is the device tensor). On an accelerator:

- ``Uploader`` copies host tensors to device buffers through pinned staging buffers with
  non-blocking copies, and records an event; the next upload waits for that event before it
  overwrites the staging buffers, so host code may keep editing its own tensors at once.
- ``fetch_to_host`` brings one device tensor to the host: the single device-to-host sync of a
  step (the grammar mask needs the tokens the device just sampled).
"""

from __future__ import annotations

import numpy as np
import torch


class Uploader:
    """Mirrors named host tensors to the device; one pinned staging buffer per name."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.on_host = self.device.type == "cpu"
        self._staging: dict[str, torch.Tensor] = {}
        self._device: dict[str, torch.Tensor] = {}
        self._event = None if self.on_host else torch.Event(self.device)

    def wait(self) -> None:
        """Block until the last upload left its staging buffers (normally long done)."""
        if self._event is not None:
            self._event.synchronize()

    def upload(
        self, tensors: dict[str, torch.Tensor], rows: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Device copies of ``tensors`` (on a CPU device: ``tensors`` itself, kept current).

        ``rows``: copy only each tensor's first rows (the rest of the device copy is stale).
        """
        if self.on_host:
            return tensors
        self.wait()
        out = {}
        for name, host in tensors.items():
            staging = self._staging.get(name)
            if staging is None or staging.shape != host.shape or staging.dtype != host.dtype:
                staging = self._staging[name] = torch.empty_like(host, pin_memory=True)
                self._device[name] = torch.empty_like(host, device=self.device)
            n = host.shape[0] if rows is None else rows
            staging[:n].copy_(host[:n])
            out[name] = self._device[name]
            out[name][:n].copy_(staging[:n], non_blocking=True)
        assert self._event is not None
        self._event.record()
        return out


def fetch_to_host(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a host array: one device-to-host copy and one sync (none on CPU)."""
    if tensor.is_cpu:
        return tensor.numpy()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    done = torch.Event(tensor.device)
    done.record()
    done.synchronize()  # the one sync: the host needs these values now
    return host.numpy()
