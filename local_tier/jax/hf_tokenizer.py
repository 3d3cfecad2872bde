"""The tokenizer of a Hugging Face model folder: ``tokenizer.json`` used as is, plus the chat
template and special tokens from the files next to it.

Read from the folder (``read_tokenizer_files``):

- ``tokenizer.json`` (required: only "fast" tokenizers are supported);
- the chat template: ``chat_template.jinja`` (how transformers 4.43+ saves it), else
  ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates, of
  which "default" is used), else ``chat_template.json``; none = the ChatML default of
  ``tokenizer.py``;
- ``bos_token``/``eos_token``/``unk_token``/``pad_token`` from ``tokenizer_config.json``
  (else the legacy ``special_tokens_map.json``), passed to the template like transformers'
  ``apply_chat_template`` does;
- EOS ids: ``generation_config.json``'s ``eos_token_id`` (an id or a list; what
  ``generate`` stops on), then ``config.json``'s, then the id of ``eos_token``.

The template renders in the same sandbox transformers uses (trim_blocks, lstrip_blocks, loop
controls, ``raise_exception``, a ``tojson`` that keeps non-ASCII text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as FastTokenizer

from local_tier.jax.gguf_loader import ModelLoadError
from local_tier.jax.tokenizer import _CHATML, Tokenizer

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass
class HFTokenizerData:
    """The tokenizer files of one folder, read but not yet parsed."""

    tokenizer_json: str
    chat_template: str | None
    special_tokens: dict[str, str]  # bos_token, eos_token, ... -> token text
    eos_token_ids: tuple[int, ...]  # from generation_config.json / config.json
    source: Path = field(default_factory=Path)


class HFTokenizer(Tokenizer):
    """``Tokenizer`` over a folder's ``tokenizer.json`` (same encode/decode/template API)."""

    def __init__(self, data: HFTokenizerData) -> None:
        # The base class builds its tokenizer from GGUF metadata; this one is complete in
        # tokenizer.json, so nothing of the base initialiser applies.
        try:
            self._hf = FastTokenizer.from_str(data.tokenizer_json)
        except Exception as exc:  # the Rust parser's errors name the bad field
            raise ModelLoadError(
                f"{data.source / 'tokenizer.json'} is not a valid tokenizer file: {exc}"
            ) from exc
        self.vocab_size = int(self._hf.get_vocab_size(with_added_tokens=True))
        added = self._hf.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        self._specials = dict(data.special_tokens)
        self.bos_token = self._specials.get("bos_token", "")
        self.eos_token = self._specials.get("eos_token", "")
        self.eos_token_ids = _eos_ids(self._hf, data.eos_token_ids, self.eos_token)
        self._template = compile_template(data.chat_template)


def _eos_ids(hf: FastTokenizer, configured: tuple[int, ...], eos_token: str) -> tuple[int, ...]:
    ids = list(dict.fromkeys(configured))
    token_id = hf.token_to_id(eos_token) if eos_token else None
    if token_id is not None and token_id not in ids:
        ids.append(int(token_id))
    return tuple(ids)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def compile_template(source: str | None) -> Any:
    """The template in transformers' sandbox; ``None`` = ChatML (as for GGUF models)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source or _CHATML)
    except TemplateError as exc:
        raise ModelLoadError(f"the chat template does not compile: {exc}") from exc


def read_tokenizer_files(folder: Path, config: dict[str, Any]) -> HFTokenizerData:
    """Read the tokenizer files of ``folder`` (see the module docstring); ``config`` is the
    parsed config.json. ``ModelLoadError`` when tokenizer.json is missing."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(
            f"Model folder {folder} has no tokenizer.json (only Hugging Face 'fast' "
            f"tokenizers are supported; save the tokenizer with transformers to create it)."
        )
    tok_config = read_json(folder / "tokenizer_config.json", required=False)
    legacy = read_json(folder / "special_tokens_map.json", required=False)
    specials = {}
    for name in SPECIAL_NAMES:
        text = _token_text(tok_config.get(name)) or _token_text(legacy.get(name))
        if text:
            specials[name] = text
    generation = read_json(folder / "generation_config.json", required=False)
    eos = _ids(generation.get("eos_token_id")) + _ids(config.get("eos_token_id"))
    eos = tuple(dict.fromkeys(eos))
    return HFTokenizerData(
        tokenizer_json=path.read_text(encoding="utf-8"),
        chat_template=_chat_template(folder, tok_config),
        special_tokens=specials,
        eos_token_ids=eos,
        source=folder,
    )


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    """A JSON object file; ``{}`` for an absent optional file; ``ModelLoadError`` otherwise."""
    if not path.is_file():
        if required:
            raise ModelLoadError(f"Model folder {path.parent} has no {path.name}.")
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} must hold a JSON object.")
    return value


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


def _chat_template(folder: Path, tok_config: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None:
        template = read_json(folder / "chat_template.json", required=False).get("chat_template")
    return template if isinstance(template, str) else None
