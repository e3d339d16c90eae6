"""The engine's vocabulary tables are built once the engine has started, before its first
constrained request (``admission.warm_when_served``, #55).

vLLM's engine loads its tokenizer after the model and the KV cache; the warm-up waits for
that (here: a stand-in for "this process holds vLLM's tokenizer"), then builds the served
vocabulary and its backends' tables in a daemon thread. Each test serves the tiny model at a
logits width of its own, so the process's vocabularies built by other tests are not theirs.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from constrained import admission
from constrained.grammars import vocab as vocab_module
from constrained.grammars.vocab import Vocab, load_vocab
from constrained.grammars.vocab_record import keep_record
from tests.test_grammar_bookkeeping import WIDTH

# What a process's first JSON rows read of the vocabulary (``Vocab._once`` names).
FIRST_ROWS_READ = ("bytes", "fingerprint", "llguidance", "encode_core", "xgrammar",
                   "finite_numbers", "closing_ranks_True", "closing_ranks_False",
                   "closing_utf8_seams")  # fmt: skip


def model_config(tiny_model_dir: str) -> SimpleNamespace:
    return SimpleNamespace(tokenizer=tiny_model_dir, model=tiny_model_dir)


def built(path: str, width: int) -> bool:
    return any(key[:2] == (path, width) for key in vocab_module._VOCABS)


def unused_width(path: str, offset: int) -> int:
    """A logits width of this test's own: no other test serves it (``test_grammar_store``
    loads ``WIDTH + 64``), so nothing in this process or the store has its tables yet."""
    width = WIDTH + 10_000 + offset
    record = admission._record_of(model_config(path), width, False)
    assert not built(path, width) and not (record and record[0].has(record[1]))
    assert (path, width, False) not in admission._WARMING
    return width


@pytest.fixture
def held(monkeypatch):
    """Whether "this process holds vLLM's tokenizer" (set by the test), and how often the
    warm-up asked."""
    state = {"held": threading.Event(), "asked": 0}

    def holds() -> bool:
        state["asked"] += 1
        return state["held"].is_set()

    monkeypatch.setattr(admission, "_holds_vllm_tokenizer", holds)
    monkeypatch.setattr(admission, "WARM_POLL_S", 0.01)
    return state


def waits(thread: threading.Thread, held: dict, path: str, width: int) -> None:
    """The warm-up asks a few times, building nothing."""
    deadline = time.monotonic() + 60
    while held["asked"] < 5 and thread.is_alive() and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert held["asked"] >= 5 and thread.is_alive() and not built(path, width)


def test_the_tables_are_built_once_vllm_holds_its_tokenizer(tiny_model_dir, held) -> None:
    width = unused_width(tiny_model_dir, 64)
    thread = admission.warm_when_served(model_config(tiny_model_dir), width)
    waits(thread, held, tiny_model_dir, width)
    # One thread per served vocabulary and process.
    assert admission.warm_when_served(model_config(tiny_model_dir), width) is thread

    held["held"].set()  # the engine's start-up is done
    thread.join(timeout=120)
    assert not thread.is_alive()
    vocab = load_vocab(tiny_model_dir, width)
    assert set(FIRST_ROWS_READ) <= set(vocab._built)
    assert vocab.width == width


def test_a_worker_of_its_own_builds_them_from_the_record(tiny_model_dir, held) -> None:
    # A worker never holds vLLM's tokenizer: it waits for the record the frontend keeps.
    width = unused_width(tiny_model_dir, 128)
    config = model_config(tiny_model_dir)
    thread = admission.warm_when_served(config, width)
    waits(thread, held, tiny_model_dir, width)

    store, key = admission._record_of(config, width, False)
    tokenizer = load_vocab(tiny_model_dir, WIDTH).hf_tokenizer
    frontend = Vocab(tokenizer, width, tokenizer.eos_token_id, "frontend")  # (not the process's)
    keep_record(store, key, tokenizer, frontend.token_bytes(), frontend.special_ids(),
                frontend.fingerprint())  # fmt: skip
    thread.join(timeout=120)
    assert not thread.is_alive()
    vocab = load_vocab(tiny_model_dir, width)
    assert vocab.from_record and vocab.fingerprint() == frontend.fingerprint()
    assert set(FIRST_ROWS_READ) <= set(vocab._built)


def test_the_grammar_processor_starts_the_warm_up(tiny_model_dir, held) -> None:
    from constrained.processors.grammar_mask import GrammarMaskProcessor
    from tests.simulate import fake_vllm_config

    width = unused_width(tiny_model_dir, 192)
    proc = GrammarMaskProcessor(
        fake_vllm_config(4, width, tiny_model_dir), torch.device("cpu"), False
    )
    key = (tiny_model_dir, width, False)
    assert key in admission._WARMING and not built(tiny_model_dir, width)
    held["held"].set()
    admission._WARMING[key].join(timeout=120)
    assert built(tiny_model_dir, width)
    assert proc.vocab is load_vocab(tiny_model_dir, width)  # the first request's, already built


def test_with_the_store_off_a_first_request_s_vocabulary_starts_it(
    tiny_model_dir, held, monkeypatch
) -> None:
    # No record and no vLLM tokenizer here: the first request loads the tokenizer, and the
    # warm-up builds the other tables from then on.
    monkeypatch.setattr(admission, "_record_of", lambda *args: None)
    width = unused_width(tiny_model_dir, 256)
    thread = admission.warm_when_served(model_config(tiny_model_dir), width)
    waits(thread, held, tiny_model_dir, width)
    vocab = load_vocab(tiny_model_dir, width)  # the first request's
    thread.join(timeout=120)
    assert not thread.is_alive() and set(FIRST_ROWS_READ) <= set(vocab._built)


def test_a_table_s_build_waits_for_no_other_table(tiny_model_dir) -> None:
    # The warm-up builds one table (here: held until released) while a first row reads
    # another: the row gets it at once.
    vocab = Vocab(load_vocab(tiny_model_dir, WIDTH).hf_tokenizer, WIDTH, 0, "two tables")
    release, started = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(timeout=60)
        return "slow"

    builder = threading.Thread(target=vocab._once, args=("slow", slow))
    builder.start()
    started.wait(timeout=60)
    assert vocab._once("quick", lambda: "quick") == "quick"
    assert builder.is_alive()  # (the slow build is still under way)
    release.set()
    builder.join(timeout=60)
    assert vocab._once("slow", lambda: "again") == "slow"  # built once


# What a frontend's first admission reads of the vocabulary (``build_admission_tables``).
ADMISSION_READS = ("bytes", "fingerprint", "llguidance", "finite_numbers",
                   "closing_ranks_True", "closing_ranks_False")  # fmt: skip


def _vllm_config(tiny_model_dir: str) -> object:
    from vllm.engine.arg_utils import EngineArgs

    from constrained.demo import engine_kwargs

    # (EngineArgs loads vLLM's general plugins: ours has InputProcessor warm the frontend.)
    return EngineArgs(model=tiny_model_dir, **engine_kwargs()).create_engine_config()


def _threads_at_warm_up_nice() -> list[str]:
    """This process's threads at the warm-up's priority (``/proc``: the 19th field is nice)."""
    from pathlib import Path

    from constrained.helper_cpus import WARM_UP_NICE

    found = []
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # (a thread that just ended)
            continue
        if int(fields[16]) == WARM_UP_NICE:
            found.append(task.name)
    return found


def test_vllm_s_frontend_warms_what_admission_reads_once_built(
    tiny_model_dir, monkeypatch, tmp_path
):
    # vLLM builds its InputProcessor (which loads the tokenizer) before it starts the engine
    # core: from then on the frontend builds the vocabulary, its record for the workers and
    # the tables the first admission reads, instead of that admission. Here with no
    # vocabulary in the process and an empty store, as on a machine's first engine.
    from vllm.v1.engine.input_processor import InputProcessor

    from constrained import settings

    monkeypatch.setattr(admission, "_WARMING", {})
    monkeypatch.setattr(vocab_module, "_VOCABS", {})
    monkeypatch.setenv("CONSTRAINED_GRAMMAR_STORE", str(tmp_path / "store"))
    settings.reset()
    try:
        config = _vllm_config(tiny_model_dir)
        path = admission.tokenizer_path(config.model_config)
        width = config.model_config.get_vocab_size()
        store, key = admission._record_of(config.model_config, width, False)
        assert not vocab_module.is_loaded(path, width) and not store.has(key)
        InputProcessor(config)
        thread = admission._WARMING[(path, width, "admission")]
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert vocab_module.is_loaded(path, width) and store.has(key)  # the workers' record
        vocab = load_vocab(path, width)
        assert set(ADMISSION_READS) <= set(vocab._built) and not vocab.from_record
        # It left no thread at its priority (its own thread may take a moment to go).
        deadline = time.monotonic() + 30
        while _threads_at_warm_up_nice() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _threads_at_warm_up_nice() == []
    finally:
        monkeypatch.undo()
        settings.reset()


def test_no_warm_up_where_the_engine_applies_no_constraint_of_ours(tiny_model_dir, monkeypatch):
    from vllm.v1.engine.input_processor import InputProcessor

    from constrained import settings

    monkeypatch.setattr(admission, "_WARMING", {})
    monkeypatch.setenv("CONSTRAINED_ENTRY_POINTS", "0")  # opted out: vLLM builds none of ours
    settings.reset()
    try:
        owner = InputProcessor(_vllm_config(tiny_model_dir))
        assert admission.warm_admission(owner) is None and not admission._WARMING
    finally:
        monkeypatch.undo()
        settings.reset()


def test_a_fork_waits_for_the_table_under_way() -> None:
    # vLLM forks its engine core from the frontend by default (no CUDA there): a child must
    # not inherit a table half built, nor its build's lock held by a thread it does not have.
    import os

    from constrained.grammars.vocab_tables import _BETWEEN_TABLES, one_table

    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(timeout=60)
        done.set()

    def build() -> None:  # as a warm-up builds each table
        with one_table():
            slow()

    builder = threading.Thread(target=build)
    builder.start()
    assert started.wait(timeout=60)
    threading.Timer(0.2, release.set).start()
    pid = os.fork()  # returns once the slow build is done
    if pid == 0:  # the child: the build was done before it, and the lock is free
        code = 1
        try:
            code = 0 if done.is_set() and _BETWEEN_TABLES.acquire(timeout=10) else 2
        finally:
            os._exit(code)
    builder.join(timeout=60)
    assert child_exit_code(pid) == 0


def test_a_forked_child_compiles_with_a_pool_of_its_own(tiny_model_dir) -> None:
    # The parent's compile pool threads are not in the child: it builds its own compiler.
    import os

    from constrained.grammars import GrammarSpec, compiler_for

    vocab = load_vocab(tiny_model_dir, WIDTH)
    compiler = compiler_for(vocab)
    compiler.compile(GrammarSpec("regex", "[ab]{1,3}"))  # the pool has started its threads
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fresh = compiler_for(vocab)
            fresh.compile(GrammarSpec("regex", "[cd]{1,3}"), timeout=60)
            code = 0 if fresh is not compiler else 2
        finally:
            os._exit(code)
    assert child_exit_code(pid) == 0


def child_exit_code(pid: int, patience_s: float = 120.0) -> int | None:
    """The forked child's exit code; ``None`` (and the child killed) if it hangs."""
    import os
    import signal

    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
