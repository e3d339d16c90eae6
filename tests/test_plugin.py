"""The vLLM plugin without an engine: entry points installed and accepted by both of vLLM's
loaders, what an engine applies (flag, entry points, and where vLLM builds none), through
vLLM's own admission code (``InputProcessor._validate_params``), and the keys of others.

The engine side (``LLM(model)`` with no flag) is the session ``llm`` fixture itself
(``conftest.py``); the stock server with ``VLLM_PLUGINS`` is ``test_plugin_server.py``.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

import constrained
from constrained import engine_processors, plugin
from constrained.engine_processors import resolve_processor


def _fqcn(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def test_entry_points_are_ours_in_application_order():
    loaded = [e.load() for e in entry_points(group=engine_processors.LOGITS_GROUP)]
    ours = [cls for cls in loaded if issubclass(cls, plugin.EntryPoint)]
    assert ours == list(plugin.ENTRY_POINT_CLASSES)
    parents = [_fqcn(cls.__mro__[2]) for cls in ours]
    assert parents == constrained.LOGITS_PROCESSORS
    for cls, entry in zip(ours, constrained.LOGITS_PROCESSORS, strict=True):
        assert cls.__name__ == resolve_processor(entry).__name__  # stats key by class name
        assert cls.OPTIONS == resolve_processor(entry).OPTIONS
    [endpoint] = [e for e in entry_points(group=plugin.ENDPOINT_GROUP) if e.name == "constrained"]
    assert endpoint.load()().name == plugin.PLUGIN_NAME


def test_pyproject_lists_the_processor_table():
    """``pyproject.toml``'s entry points, ``LOGITS_PROCESSORS`` and the plugin's classes all
    come from ``processor_table.PROCESSORS``."""
    import pathlib

    import tomllib

    from constrained import processor_table

    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    assert project["entry-points"][engine_processors.LOGITS_GROUP] == (
        processor_table.entry_points()
    )
    assert [row.path for row in processor_table.PROCESSORS] == constrained.LOGITS_PROCESSORS
    names = [cls.__name__ for cls in plugin.ENTRY_POINT_CLASSES]
    assert names == [row.name for row in processor_table.PROCESSORS]
    for cls in plugin.ENTRY_POINT_CLASSES:
        assert getattr(plugin, cls.__name__) is cls and cls.__module__ == "constrained.plugin"


def test_both_vllm_loaders_accept_the_entry_points():
    """V1's loader and V2's (which rejects V1-interface plugins) load every one of ours."""
    from vllm.v1.sample.logits_processor import _load_logitsprocs_plugins
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_plugins

    for loaded in (_load_logitsprocs_plugins(), _load_v2_logitsprocs_plugins()):
        assert [c for c in loaded if issubclass(c, plugin.EntryPoint)] == list(
            plugin.ENTRY_POINT_CLASSES
        )


def test_entry_point_is_inert_when_the_flag_names_ours():
    config = SimpleNamespace(model_config=SimpleNamespace(logits_processors=["x.y:Other"]))
    assert engine_processors.entry_points_active(config)
    for flag in (
        constrained.LOGITS_PROCESSORS,
        [resolve_processor(constrained.LOGITS_PROCESSORS[0])],
    ):
        config = SimpleNamespace(model_config=SimpleNamespace(logits_processors=flag))
        assert not engine_processors.entry_points_active(config)
        proc = plugin.GrammarMaskProcessor(config, torch.device("cpu"), False)
        logits = torch.zeros(2, 8)
        assert proc.inert and proc.apply(logits) is logits
        assert proc.add_request(0, SamplingParams(extra_args={"regex": "a"})) is False
        proc.update_state(None)
        proc.apply_staged_writes()


def _config(**changes):
    model_config = SimpleNamespace(logits_processors=None, runner_type="generate")
    base = dict(model_config=model_config, use_v2_model_runner=False, speculative_config=None,
                scheduler_config=SimpleNamespace(async_scheduling=False))  # fmt: skip
    base.update(changes)
    return SimpleNamespace(**base)


def test_applied_options_where_vllm_builds_none():
    every = frozenset(constrained.Options.model_fields) - {"close_at_max_tokens"}
    applied, reasons = engine_processors.applied_options(_config())
    assert {"json_schema", "min_p", "dry_multiplier", "xtc_probability"} <= applied
    assert not reasons
    pooling = _config(model_config=SimpleNamespace(logits_processors=None, runner_type="pooling"))
    applied, reasons = engine_processors.applied_options(pooling)
    assert not applied and "pooling" in reasons["json_schema"]
    spec = _config(speculative_config=SimpleNamespace(num_speculative_tokens=2))
    applied, reasons = engine_processors.applied_options(spec)
    assert not applied and "speculative decoding" in reasons["min_p"]
    # V2 builds entry points with speculative decoding.
    applied, _ = engine_processors.applied_options(
        _config(use_v2_model_runner=True, speculative_config=1)
    )
    assert "json_schema" in applied
    # V1 + async scheduling: processors reading output tokens are refused, others kept.
    async_v1 = _config(scheduler_config=SimpleNamespace(async_scheduling=True))
    applied, reasons = engine_processors.applied_options(async_v1)
    assert {"min_p", "logit_bias", "xtc_probability", "top_n_sigma"} <= applied
    assert "json_schema" in reasons and "async scheduling" in reasons["frequency_penalty"]
    assert every & applied | set(reasons) >= {"json_schema", "dry_multiplier", "min_p"}


@pytest.fixture(scope="module")
def frontend(tiny_model_dir):
    """vLLM's real config and InputProcessor for the tiny model with NO logits_processors."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.input_processor import InputProcessor

    from constrained.demo import engine_kwargs

    config = EngineArgs(model=tiny_model_dir, **engine_kwargs()).create_engine_config()
    assert not config.model_config.logits_processors
    renderer = InputProcessor(config).renderer

    def admit(extra_args: dict, flag: list | None = None, **config_changes) -> None:
        """Admit through a new ``InputProcessor``; ``flag``: ``--logits-processors``."""
        saved = {k: getattr(config, k) for k in config_changes}
        saved_flag = config.model_config.logits_processors
        try:
            for key, value in config_changes.items():
                object.__setattr__(config, key, value)
            object.__setattr__(config.model_config, "logits_processors", flag)
            processor = InputProcessor(config, renderer)
            processor._validate_params(
                SamplingParams(max_tokens=32, extra_args=extra_args), ("generate",)
            )
        finally:
            for key, value in saved.items():
                object.__setattr__(config, key, value)
            object.__setattr__(config.model_config, "logits_processors", saved_flag)

    return admit


def test_stock_admission_checks_our_options_without_a_flag(frontend):
    frontend({"json_schema": '{"type": "integer"}', "min_p": 0.1, "dry_multiplier": 0.5})
    with pytest.raises(VLLMValidationError, match="'min_p'"):
        frontend({"min_p": 2.0})
    with pytest.raises(VLLMValidationError, match="Did you mean 'json_schema'"):
        frontend({"json_shema": "{}"})


def test_refused_where_vllm_builds_no_processors(frontend):
    """V1 with speculative decoding builds no entry-point processors: refused, not dropped."""
    spec = SimpleNamespace(num_speculative_tokens=2)
    with pytest.raises(VLLMValidationError, match=r"'regex'.*speculative decoding"):
        frontend({"regex": "[0-9]+"}, speculative_config=spec)
    # vLLM builds no processor there, so nobody reads another key either.
    with pytest.raises(VLLMValidationError, match=r"'other_plugin_scale'.*no logits processor"):
        frontend({"other_plugin_scale": 2.0}, speculative_config=spec)
    frontend({"session_id": "s"}, speculative_config=spec)  # vLLM's own


FOREIGN = "tests.foreign_processor:BanTokenProcessor"
OCR = "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor"


def test_a_key_nobody_reads_is_refused_naming_it(frontend):
    """Every processor the engine builds is ours (the entry points, no flag): a key none of
    them reads would be dropped, so it is refused; other engines' names get a hint."""
    with pytest.raises(
        VLLMValidationError, match="'frobnicate_penalty': unknown option: no logits processor"
    ):
        frontend({"frobnicate_penalty": 1.0})
    for name, ours, origin in [("repeat_penalty", "repetition_penalty", "llama.cpp"),
                               ("repeat_last_n", "penalty_last_n", "llama.cpp"),
                               ("no_repeat_ngram", "no_repeat_ngram_size", ""),
                               ("guided_json", "json_schema", "vLLM's older guided decoding"),
                               ("frequency_penality", "frequency_penalty", "")]:  # fmt: skip
        with pytest.raises(VLLMValidationError) as refused:
            frontend({name: 1.1})
        message = str(refused.value)
        assert f"'{name}'" in message and f"Did you mean '{ours}'" in message, message
        assert origin in message
    # The same with our processors named by the flag (our launcher's old way).
    with pytest.raises(VLLMValidationError, match="'frobnicate_penalty'"):
        frontend({"frobnicate_penalty": 1.0}, flag=list(constrained.LOGITS_PROCESSORS))


def test_vllms_own_keys_pass(frontend):
    """The keys vLLM itself reads from ``extra_args`` (``VLLM_EXTRA_ARGS_KEYS``) are never
    refused, beside ours or alone."""
    from constrained.request_options import VLLM_EXTRA_ARGS_KEYS

    values = {"kv_transfer_params": {"do_remote_prefill": False}, "session_id": "s-1",
              "kv_cache_report_mode": "incremental"}  # fmt: skip
    for key in sorted(VLLM_EXTRA_ARGS_KEYS):
        frontend({key: values.get(key, 1)})
        frontend({key: values.get(key, 1), "min_p": 0.1})


def test_vllm_reads_no_other_extra_args_keys():
    """A scan of the installed vLLM's source: every key it reads from a request's
    ``extra_args`` / ``vllm_xargs`` is in ``VLLM_EXTRA_ARGS_KEYS`` or one of ours (DeepSeek-OCR's
    processor's names are our aliases), so a vLLM upgrade that reads a new one fails here."""
    import ast
    import pathlib

    import vllm

    from constrained.request_options import OPTION_KEYS, VLLM_EXTRA_ARGS_KEYS

    found: dict[str, str] = {}
    for path in pathlib.Path(vllm.__file__).parent.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "extra_args" not in text and "vllm_xargs" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            owner = key = None
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get" and node.args
                    and isinstance(node.args[0], ast.Constant)):  # fmt: skip
                owner, key = node.func.value, node.args[0].value
            elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                    and isinstance(node.slice, ast.Constant)):  # fmt: skip
                owner, key = node.value, node.slice.value
            source = ast.unparse(owner) if owner is not None else ""
            if isinstance(key, str) and (
                source.endswith(("extra_args", "vllm_xargs")) or source == "extra"
            ):
                found.setdefault(key, str(path))
    assert {"kv_transfer_params", "session_id", "diffusion_max_steps"} <= set(found)
    assert set(found) <= VLLM_EXTRA_ARGS_KEYS | OPTION_KEYS, found


def test_keys_pass_where_a_processor_we_do_not_know_is_built(frontend, monkeypatch):
    """Another package's processor may read any key: unknown keys pass, near misses of
    ours do not; a processor whose keys we know (DeepSeek-OCR's) reads only those."""
    from constrained.settings import reset

    frontend({"other_plugin_scale": 2.0, "regex": "[0-9]+", "session_id": "s"}, flag=[FOREIGN])
    for typo, ours in [("min_pp", "min_p"), ("Min-P", "min_p"), ("regx", "regex"),
                       ("frequency_penality", "frequency_penalty")]:  # fmt: skip
        with pytest.raises(VLLMValidationError, match=f"Did you mean '{ours}'"):
            frontend({typo: 0.1}, flag=[FOREIGN])
    # DeepSeek-OCR's module needs torchvision, which the CPU build lacks: its class by name.
    module, _, name = OCR.partition(":")
    ocr = type(name, (), {"__module__": module, "__qualname__": name})
    config = _config(model_config=SimpleNamespace(logits_processors=[ocr], runner_type="generate"))
    assert engine_processors.keys_of_other_processors(config) == {"ngram_size", "window_size",
                                                       "whitelist_token_ids"}  # fmt: skip
    foreign = _config(model_config=SimpleNamespace(logits_processors=[FOREIGN, ocr]))
    assert engine_processors.keys_of_other_processors(foreign) is None
    monkeypatch.setenv("CONSTRAINED_ALLOWED_EXTRA_ARGS", "min_q,other_plugin_scale")
    reset()
    try:
        frontend({"min_q": 0.1, "other_plugin_scale": 2.0})  # declared for another plugin
    finally:
        monkeypatch.undo()
        reset()
    for mode, refused in [("refuse", True), ("pass", False)]:
        monkeypatch.setenv("CONSTRAINED_UNKNOWN_EXTRA_ARGS", mode)
        reset()
        try:
            for flag in ([FOREIGN], None):
                if refused:
                    with pytest.raises(VLLMValidationError, match="'other_plugin_scale'"):
                        frontend({"other_plugin_scale": 2.0}, flag=flag)
                else:
                    frontend({"other_plugin_scale": 2.0}, flag=flag)
        finally:
            monkeypatch.undo()
            reset()


def test_opt_out_makes_entry_points_inert(frontend, monkeypatch):
    from constrained.settings import reset

    monkeypatch.setenv("CONSTRAINED_ENTRY_POINTS", "0")
    reset()
    try:
        with pytest.raises(
            VLLMValidationError, match=r"'min_p': is not applied .*CONSTRAINED_ENTRY_POINTS=0"
        ):
            frontend({"min_p": 0.1})
    finally:
        monkeypatch.undo()
        reset()
