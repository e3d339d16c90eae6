"""Host syncs inside our processors under Model Runner V2, counted on CPU.

On a GPU, reading a device tensor's value on the host (``.item()``, ``.tolist()``,
``.cpu()``, ``bool(t)``, ``nonzero()``...) waits for the device. On CPU nothing waits, but
every such read still goes through torch's ``__torch_function__``, so a ``TorchFunctionMode``
active while our processors run sees them all. ``SyncGuard`` fails on any read outside the
one place allowed to make it (``transfer.fetch_to_host``, the grammar mask's fetch of the
tokens the device sampled) and counts those fetches per ``apply`` call.

Not counted: work done inside kernels (our Triton bias / penalty / min-p kernels run in the
interpreter here, which reads its arguments on the host; xgrammar's bitmask kernel has a
CPU-only path). On a GPU both are launches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods that hand a value to the host (a device sync on a GPU).
HOST_READS = frozenset(
    {
        "cpu",
        "tolist",
        "item",
        "numpy",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__array__",
        "nonzero",
        "masked_select",
        "unique",
    }
)
# (module, name) of functions whose insides are not ours to count: kernels, and the one fetch.
KERNELS = (
    ("constrained.processors.device_counts", "apply_fused_elementwise"),
    ("constrained.processors.grammar_mask", "apply_token_bitmask"),
)
FETCH = ("constrained.processors.mask_fill", "fetch_to_host")


class SyncGuardError(AssertionError):
    pass


class SyncGuard(TorchFunctionMode):
    """Active while one of our processors runs; raises on a host read outside the fetch."""

    def __init__(self) -> None:
        super().__init__()
        self.host_buffers: list[Callable[[], Any]] = []  # our host-resident tensors, by design
        self.paused = 0
        self.calls = 0  # guarded apply calls
        self.fetches = 0
        self.max_fetches_per_call = 0
        self.where = ""
        # When a list: each apply call appends (processor, its output rows' bit hashes), so a
        # scenario can say which processor first made two runs differ (tensor_parallel_ranks).
        self.trace: list[tuple[str, list[int]]] | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        name = getattr(func, "__name__", "")
        if not self.paused and name in HOST_READS and not self._host_resident(args):
            raise SyncGuardError(f"host read {name}() in {self.where}: a device sync on a GPU")
        return func(*args, **(kwargs or {}))

    def _host_resident(self, args: Any) -> bool:
        """A read of one of our host buffers (e.g. the grammar bitmask the matchers write)."""
        tensor = args[0] if args else None
        if not isinstance(tensor, torch.Tensor):
            return False
        ptr = tensor.untyped_storage().data_ptr()
        return any(ptr == buf().untyped_storage().data_ptr() for buf in self.host_buffers)

    def install(self, processors: list[Any]) -> None:
        """Wrap each processor's per-step entry points, and pause around kernels / the fetch."""
        import importlib

        for module_name, name in KERNELS:
            module = importlib.import_module(module_name)
            setattr(module, name, self._paused(getattr(module, name)))
        module_name, name = FETCH
        module = importlib.import_module(module_name)
        setattr(module, name, self._fetch(getattr(module, name)))
        for proc in processors:
            writer = getattr(proc, "writer", None)
            if writer is not None:  # the host bitmask (reallocated as batches grow)
                self.host_buffers.append(lambda writer=writer: writer.bitmask)
                self.host_buffers.append(lambda writer=writer: writer.scratch)  # witness walks
            for method in ("apply", "apply_staged_writes"):
                setattr(proc, method, self._guarded(getattr(proc, method), proc, method))

    def _guarded(self, fn: Callable, proc: Any, method: str) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            self.where = f"{type(proc).__name__}.{method}"
            before = self.fetches
            with self:
                out = fn(*args, **kwargs)
            if method == "apply":
                self.calls += 1
                self.max_fetches_per_call = max(self.max_fetches_per_call, self.fetches - before)
                if self.trace is not None and isinstance(out, torch.Tensor):
                    self.trace.append((type(proc).__name__, row_hashes(out)))
            return out

        return run

    def _paused(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            self.paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused -= 1

        return run

    def _fetch(self, fn: Callable) -> Callable:
        paused = self._paused(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            self.fetches += 1
            return paused(*args, **kwargs)

        return run

    def counts(self) -> dict[str, int]:
        return {
            "guarded_apply_calls": self.calls,
            "host_fetches": self.fetches,
            "max_fetches_per_apply": self.max_fetches_per_call,
        }


def row_hashes(logits: torch.Tensor) -> list[int]:
    """Each row's float32 bits folded into one integer (equal rows, equal hashes)."""
    bits = logits.detach().float().contiguous().view(torch.int32).to(torch.int64)
    weights = torch.arange(1, bits.shape[1] + 1, device=bits.device, dtype=torch.int64)
    return ((bits * weights).sum(dim=1) ^ bits.sum(dim=1)).cpu().tolist()
