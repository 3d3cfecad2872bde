"""Tokenizer and chat template rebuilt from GGUF metadata.

SmolLM2 (``tokenizer.ggml.model = gpt2``, ``pre = smollm``) is byte-level BPE whose
pre-tokenizer first splits every digit, then applies the GPT-2 regex; control tokens
(token_type 3) are special tokens, so ``<|im_start|>`` in a rendered chat prompt encodes to
its own id. No BOS is added: the GGUF says ``add_bos_token`` but its BOS is ``<|im_start|>``,
which the chat template already writes (Hugging Face's tokenizer adds none either).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from local_tier.jax.gguf_loader import ModelLoadError, TokenizerData

CONTROL = 3
# Tokens that end an assistant turn in ChatML-style templates besides the metadata's EOS.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


class Tokenizer:
    """Text <-> token ids, and chat prompts. Thread-safe for encode/decode."""

    def __init__(self, data: TokenizerData) -> None:
        if data.model != "gpt2":
            raise ModelLoadError(
                f"tokenizer model {data.model!r} is not supported (only byte-level BPE 'gpt2')"
            )
        self._hf = _build_hf(data)
        self.vocab_size = len(data.tokens)
        self.special_ids = frozenset(i for i, t in enumerate(data.token_types) if t == CONTROL)
        self.eos_token_ids = _eos_ids(data)
        self.bos_token = data.tokens[data.bos_token_id] if data.bos_token_id is not None else ""
        self.eos_token = data.tokens[self.eos_token_ids[0]] if self.eos_token_ids else ""
        # what the template sees besides the messages (a folder's tokenizer has more)
        self._specials = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        self._template = _compile_template(data.chat_template)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their ids."""
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; bytes that do not form complete UTF-8 become U+FFFD."""
        return str(self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` ({"role", "content": str}) with the model's jinja2 template
        and its special tokens."""
        try:
            return str(
                self._template.render(
                    messages=messages, add_generation_prompt=add_generation_prompt, **self._specials
                )
            )
        except TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from exc


def render_chat_prompt(tokenizer: Tokenizer, messages: Sequence[Any]) -> str:
    """Render OpenAI-style chat messages (dicts or msgspec Structs) to a prompt string.

    Content given as a list of parts keeps only the text parts, joined by newlines;
    ``developer`` becomes ``system`` (OpenAI's newer name for it); ``None`` content is empty.
    """
    plain = [_plain_message(m) for m in messages]
    return tokenizer.apply_chat_template(plain, add_generation_prompt=True)


def _plain_message(m: Any) -> dict[str, Any]:
    d = m if isinstance(m, Mapping) else msgspec.to_builtins(m)
    role = str(d.get("role", "user"))
    content = d.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        content = "\n".join(t for t in texts if isinstance(t, str) and t)
    return {"role": "system" if role == "developer" else role, "content": content or ""}


def _build_hf(data: TokenizerData) -> HFTokenizer:
    vocab = {tok: i for i, tok in enumerate(data.tokens)}
    merges: list[tuple[str, str]] = []
    for m in data.merges:
        left, _, right = m.partition(" ")
        merges.append((left, right))
    tok = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if data.pre in ("smollm", "starcoder", "refact"):
        # These models split every digit on its own before the GPT-2 regex.
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(data.tokens, data.token_types, strict=False) if ty == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def _eos_ids(data: TokenizerData) -> tuple[int, ...]:
    """EOS ids: the end-of-turn tokens the vocabulary has, then the metadata's EOS.

    SmolLM2's GGUF names ``<|im_start|>`` (1) as EOS, but its chat turns end with
    ``<|im_end|>`` (2); stopping on all of them is what a chat server needs.
    """
    index = {t: i for i, t in enumerate(data.tokens) if t in END_OF_TURN}
    ids = [index[t] for t in END_OF_TURN if t in index]
    if data.eos_token_id is not None and data.eos_token_id not in ids:
        ids.append(data.eos_token_id)
    return tuple(ids)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _compile_template(source: str | None) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = lambda v, **_: msgspec.json.encode(v).decode()
    return env.from_string(source or _CHATML)


# Used when the file carries no template: plain ChatML, which SmolLM2-style models expect.
_CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
