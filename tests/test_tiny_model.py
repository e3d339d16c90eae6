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


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    a = cli("--out", str(tmp_path / "a"))
    b = cli("--out", str(tmp_path / "b"))
    c = cli("--out", str(tmp_path / "c"), "--seed", "1")
    assert digest(a) == digest(b) != digest(c)


def test_tokenizer_is_qwens(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.encode('{"name": "Ada"}') == [4913, 606, 788, 330, 95347, 9207]
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 151_643
