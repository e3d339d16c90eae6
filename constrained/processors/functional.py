"""Pure tensor functions behind the processors: no vLLM, no state, batched over rows.

Every function edits ``logits`` ([rows, vocab], float32) in place and returns it. Per-row
parameters come as tensors already gathered for those rows, so the same function serves
Model Runner V1 (row = batch index) and V2 (row = logits row, mapped from a request slot).
"""

from __future__ import annotations

import numpy as np
import torch

# Padding for unused bias slots: x + (-0.0) == x for every float x, -0.0 and inf included,
# so padded entries leave logits bit-for-bit unchanged.
NEUTRAL_BIAS = -0.0
# A penalty is a finite push: it moves a logit no further than +-PENALTY_LIMIT_LOGIT (a logit
# already past it stays where it is). Far beyond any logit a model gives, and far enough
# inside float32 that dividing by the smallest temperature vLLM samples with (1e-5) stays
# finite: no penalty can leave a row, or the tokens a grammar allows, with no finite logit.
PENALTY_LIMIT_LOGIT = 1e30


def apply_logit_bias(
    logits: torch.Tensor, token_ids: torch.Tensor, biases: torch.Tensor
) -> torch.Tensor:
    """Add per-row sparse biases: ``logits[r, token_ids[r, k]] += biases[r, k]``.

    Args:
        logits: [rows, vocab] float32.
        token_ids: [rows, K] int64; unused entries point anywhere with bias ``NEUTRAL_BIAS``.
        biases: [rows, K] float32.

    Example::

        >>> logits = torch.zeros(1, 4)
        >>> apply_logit_bias(logits, torch.tensor([[2, 0]]), torch.tensor([[5.0, -0.0]]))
        tensor([[0., 0., 5., 0.]])
    """
    return logits.scatter_add_(1, token_ids, biases)


def apply_min_p(logits: torch.Tensor, log_min_p: torch.Tensor) -> torch.Tensor:
    """Min-p filtering: drop tokens whose probability is below ``min_p`` times the top one.

    ``p_i < min_p * p_max`` with ``p = softmax(l / T)`` is, taking logs,
    ``l_i < l_max + T * log(min_p)``, so no softmax is needed: one max and one compare.

    Args:
        logits: [rows, vocab] float32 (raw, or already divided by temperature).
        log_min_p: [rows] float32, ``T * log(min_p)`` (``T = 1`` for logits already divided
            by temperature); ``-inf`` leaves the row untouched (min_p off, or greedy).

    Example::

        >>> logits = torch.tensor([[0.0, -1.0, -3.0]])
        >>> apply_min_p(logits, torch.log(torch.tensor([0.2])))  # exp(-3) < 0.2 <= exp(-1)
        tensor([[ 0., -1., -inf]])
    """
    threshold = logits.amax(dim=-1, keepdim=True).add_(log_min_p.unsqueeze(1))
    return logits.masked_fill_(logits < threshold, float("-inf"))


def apply_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_counts: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """Repetition, frequency and presence penalties, with vLLM's exact float32 arithmetic.

    For a token counted ``o`` times in the output and ``q`` times in the prompt:
    ``l *= (1 / r if l > 0 else r) if o + q > 0``, then ``l -= f * o``, then
    ``l -= p * (o > 0)``. The same ops in the same order as vLLM's ``apply_penalties``, so the
    results are bit-identical. Tokens with no counts are unchanged bit for bit. A result is
    kept within ``+-PENALTY_LIMIT_LOGIT`` (a repetition penalty of ``1e38`` would reach
    ``-inf``, where vLLM's float32 arithmetic leaves the row no finite logit).

    Works dense (``logits`` [rows, vocab], counts per vocab entry) or sparse (``logits`` the
    gathered values of the tokens a row has seen, counts aligned with them).

    Args:
        logits: [rows, n] float32, edited in place.
        output_counts, prompt_counts: [rows, n] integer counts.
        repetition, frequency, presence: [rows] float32 (1, 0, 0 leave a row unchanged).

    Example::

        >>> l = torch.tensor([[2.0, -2.0, 1.0]])
        >>> apply_penalties(l, torch.tensor([[1, 0, 0]]), torch.tensor([[0, 1, 0]]),
        ...                 torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25]))
        tensor([[ 0.2500, -4.0000,  1.0000]])
    """
    seen = (output_counts + prompt_counts) > 0
    low, high = logits.clamp(max=-PENALTY_LIMIT_LOGIT), logits.clamp(min=PENALTY_LIMIT_LOGIT)
    penalties = torch.where(seen, repetition.unsqueeze(1), 1.0)
    logits *= torch.where(logits > 0, 1.0 / penalties, penalties)
    logits -= frequency.unsqueeze(1) * output_counts
    logits -= presence.unsqueeze(1) * (output_counts > 0)
    return torch.clamp(logits, low, high, out=logits)


def apply_sparse_penalties(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_counts: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """``apply_penalties`` on the tokens each row has seen only: gather, penalize, scatter.

    Untouched tokens would be unchanged anyway, so this costs O(rows x seen) instead of
    O(rows x vocab). Padding entries must repeat one of the row's real (token, counts)
    entries (or point anywhere with zero counts in a row that has none), so that duplicate
    scatter targets all receive the same value.

    Args:
        logits: [rows, vocab] float32, edited in place.
        token_ids: [rows, K] int64, the tokens counted per row.
        output_counts, prompt_counts: [rows, K] counts aligned with ``token_ids``.
        repetition, frequency, presence: [rows] float32.
    """
    values = logits.gather(1, token_ids)
    apply_penalties(values, output_counts, prompt_counts, repetition, frequency, presence)
    return logits.scatter_(1, token_ids, values)


def pad_like_first(used: torch.Tensor, *tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Replace entries at or past ``used[row]`` with the row's first entry, in each table.

    Args:
        used: [rows] number of real entries per row.
        tables: [rows, K] each, aligned column by column.
    """
    real = torch.arange(tables[0].shape[1], device=used.device) < used.unsqueeze(1)
    return tuple(torch.where(real, table, table[:, :1]) for table in tables)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Set ``logits[r, t] = -inf`` where bit ``t`` of ``bitmask[r]`` is 0, for ``r`` in ``rows``.

    ``bitmask`` is int32 ``[>= max(rows) + 1, ceil(width / 32)]`` on the logits' device, bit
    ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed. Only lowers logits, so it
    never raises a token something earlier masked. Uses xgrammar's kernels (C++ on CPU,
    CUDA/Triton on GPU); the torch fallback unpacks the bits.
    """
    if not rows:
        return
    if bitmask.shape[1] * 32 < logits.shape[1]:
        raise ValueError("bitmask narrower than the logits")
    try:
        from xgrammar import apply_token_bitmask_inplace
    except ImportError:  # pragma: no cover - xgrammar ships with vLLM
        apply_token_bitmask_torch(logits, bitmask, rows)
        return
    if logits.is_cpu and logits.is_contiguous() and logits.shape[1] % 32 == 0:
        bitmask, rows = _mask_on_host(logits, bitmask, rows)
        if not rows:
            return
    apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[1], indices=rows)


_BITS = np.arange(32, dtype=np.uint32)


def _mask_on_host(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]
) -> tuple[torch.Tensor, list[int]]:
    """Mask what xgrammar's CPU kernel does slowly; return the bitmask and rows left to it.

    The kernel visits masked tokens one by one: 0.9 ms a row of 151,936 when few tokens
    are allowed (JSON structure), 16 us when most are (inside a string). So by row:

    - few words with any bit set (at most ``1 / 16`` of them): the allowed logits are kept
      aside, the row set to ``-inf`` (one fill), the kept logits put back; done here;
    - almost every word with a bit set (at most ``1 / 64`` all-zero): left to the kernel
      alone;
    - between: every all-zero word's 32 logits masked at once (rows of a ``[rows * words,
      32]`` view); the kernel finishes the mixed words, with those words set to
      all-allowed in a copy of the bitmask.

    The bookkeeping is NumPy on the host bitmask: a few microseconds where torch's small
    ops cost ~70 us a step at one row.
    """
    words = logits.shape[1] // 32
    index = np.asarray(rows, dtype=np.int64)
    host = bitmask.numpy()
    # One row is read as a view; several as a copy, [len(rows), words].
    selected = host[rows[0] : rows[0] + 1, :words] if len(rows) == 1 else host[index, :words]
    if np.count_nonzero(selected) > selected.size - selected.size // 64:  # (one pass)
        return bitmask, rows  # every row mostly allowed (text): the kernel alone
    set_words = np.count_nonzero(selected, axis=1)
    sparse = set_words <= words // 16
    mixed = ~sparse & (set_words <= words - words // 64)
    if sparse.any():
        _keep_allowed(logits, index[sparse], selected[sparse])
    if mixed.any():
        patched = selected[mixed]  # (a copy)
        empty = patched == 0
        row_of, word_of = np.nonzero(empty)
        flat = index[mixed][row_of] * words + word_of
        if logits.dtype == torch.float32:  # NumPy's row writes: 2/3 of ``index_fill_``'s time
            logits.numpy().reshape(-1, 32)[flat] = -np.inf
        else:
            logits.view(-1, 32).index_fill_(0, torch.from_numpy(flat), float("-inf"))
        bitmask = bitmask.clone()
        patched[empty] = -1
        bitmask.numpy()[index[mixed], :words] = patched
    return bitmask, index[~sparse].tolist()


def _keep_allowed(logits: torch.Tensor, index: np.ndarray, selected: np.ndarray) -> None:
    """Rows ``index`` of ``logits`` set to ``-inf`` but for the tokens their bitmask words
    ``selected`` allow, which keep their logits."""
    row_of, word_of = np.nonzero(selected != 0)  # (faster on booleans than on int32)
    bits = selected[row_of, word_of].view(np.uint32)[:, None] >> _BITS & 1
    which, bit = np.nonzero(bits)
    rows = index[row_of[which]]
    tokens = word_of[which].astype(np.int64) * 32 + bit
    if logits.dtype == torch.float32:
        # NumPy, not torch: a torch fill of a row runs in its thread pool, whose threads wait
        # on each other at every call; with another process on the cores (the engine's
        # front end) 55 rows took 11-440 ms against 1.3 ms here (2-core machine, 2 threads).
        host = logits.numpy()
        kept = host[rows, tokens]
        host[index] = -np.inf
        host[rows, tokens] = kept
        return
    row_ids, token_ids = torch.from_numpy(rows), torch.from_numpy(tokens)
    kept = logits[row_ids, token_ids]
    for row in index.tolist():  # a row's fill: 6x faster than one index_fill_ over rows
        logits[row].fill_(float("-inf"))
    logits[row_ids, token_ids] = kept


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Reference of ``apply_token_bitmask`` in plain torch ops."""
    index = torch.tensor(rows, device=logits.device)
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask[index].unsqueeze(-1) >> shifts) & 1).flatten(1)[:, : logits.shape[1]]
    logits[index] = logits[index].masked_fill(allowed == 0, float("-inf"))
