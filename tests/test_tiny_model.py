"""The embedded default model: deterministic, cached, real Qwen tokenizer, right widths."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest


def cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "constrained", "tiny-model", *args],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def digest(path: str) -> str:
    with open(f"{path}/model.safetensors", "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize(("vocab", "width"), [("qwen2", 151_936), ("qwen3.6", 248_320)])
def test_builds_prints_its_directory_last_and_reuses_it(tmp_path, vocab, width):
    out = tmp_path / vocab
    first = cli("--vocab", vocab, "--out", str(out))
    assert first == str(out)
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == width
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["dtype"] == "float32"
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # CPU attention needs 64
    before = digest(first)
    assert cli("--vocab", vocab, "--out", str(out)) == first  # reused
    assert digest(first) == before


def test_same_seed_same_weights_other_seed_other_weights(tmp_path, tiny_model_dir):
    a = tiny_model_dir  # the session's build of seed 0 (in the pytest process, or cached)
    b = cli("--out", str(tmp_path / "b"))
    c = cli("--out", str(tmp_path / "c"), "--seed", "1")
    assert digest(a) == digest(b) != digest(c)


def test_tokenizer_is_qwens(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.encode('{"name": "Ada"}') == [4913, 606, 788, 330, 95347, 9207]
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 151_643


def test_qwen36_template_renders_tools_calls_results_and_thinking():
    """The tiny qwen3.6 model's chat template, as Qwen3.5/3.6's: tools in the system turn,
    an earlier call in Qwen3.5's XML (what vLLM's qwen3_coder parser reads), tool results as
    one user turn, earlier thinking kept, and the generation prompt's thinking block open
    (thinking on) or closed and empty (``enable_thinking=False``)."""
    from transformers import AutoTokenizer

    from constrained.tiny_model import build_tiny_model

    tok = AutoTokenizer.from_pretrained(str(build_tiny_model("qwen3.6")))
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    call = {"type": "function", "function": {"name": "get_weather",
                                             "arguments": {"city": "Oslo", "days": 2}}}  # fmt: skip
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "\nLook it up.\n",
            "tool_calls": [call, call],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rain"},
    ]
    text = tok.apply_chat_template(messages, tools=[tool], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    one_call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
                "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")  # fmt: skip
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert "<tools>\n" + json.dumps(tool) + "\n</tools>" in text
    assert text.count("<|im_start|>system") == 1
    assert ("<|im_start|>assistant\n<think>\nLook it up.\n</think>\n\n"
            + one_call + "\n" + one_call + "<|im_end|>\n") in text  # fmt: skip
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n"
            "rain\n</tool_response><|im_end|>\n") in text  # fmt: skip
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    closed = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True,
                                     enable_thinking=False)  # fmt: skip
    assert closed == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather?"
                      "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")  # fmt: skip


def test_a_build_finished_second_leaves_the_first_in_place(tmp_path):
    """Two processes building the same model at once (pytest's two workers on a clean machine):
    the one that finishes second keeps the first's directory, which an engine may be reading."""
    from constrained.tiny_model import COMPLETE_MARKER, _move_into_place

    recipe = {"vocab": "qwen2", "seed": 0, "version": 1}
    out, staging = tmp_path / "model", tmp_path / ".model.building"
    for directory, weights in ((out, b"first"), (staging, b"second")):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(weights)
        (directory / COMPLETE_MARKER).write_text(json.dumps(recipe) + "\n")
    inode = out.stat().st_ino
    _move_into_place(staging, out, recipe)
    assert out.stat().st_ino == inode
    assert (out / "model.safetensors").read_bytes() == b"first"
