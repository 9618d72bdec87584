"""The document corpus behind web_search and crawl_page: loading, BM25 ranking, snippets,
and ingestion of text, Markdown and JSONL files (`gearshift corpus add PATH`)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from gearshift.settings import Settings

SAMPLE_CORPUS = Path(__file__).with_name("sample_corpus.jsonl")  # shipped as package data
TEXT_SUFFIXES = {".txt", ".text"}
MARKDOWN_SUFFIXES = {".md", ".markdown"}
JSONL_SUFFIXES = {".jsonl"}
SNIPPET_CHARS = 240

_WORD = re.compile(r"\w+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were what when "
    "where which who whom why how with did does do".split()
)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords (the BM25 vocabulary)."""
    return [t for t in _WORD.findall(text.lower()) if t not in STOPWORDS]


@dataclass(frozen=True)
class Document:
    """One searchable document."""

    id: str
    title: str
    text: str
    url: str = ""


@dataclass(frozen=True)
class SearchHit:
    """One ranked result."""

    document: Document
    score: float
    snippet: str


class CorpusError(ValueError):
    """A corpus file that cannot be read as documents."""


class Corpus:
    """Documents with a BM25 (Okapi, k1=1.5, b=0.75) inverted index."""

    def __init__(self, documents: list[Document], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self._by_id: dict[str, Document] = {}
        for doc in documents:
            self._by_id.setdefault(doc.id, doc)  # first one wins on duplicate ids
        self.documents = list(self._by_id.values())
        self._postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._lengths: list[int] = []
        for index, doc in enumerate(self.documents):
            terms = Counter(tokenize(f"{doc.title} {doc.text}"))
            self._lengths.append(sum(terms.values()))
            for term, count in terms.items():
                self._postings[term].append((index, count))
        self._average_length = sum(self._lengths) / len(self._lengths) if self._lengths else 0.0

    def __len__(self) -> int:
        return len(self.documents)

    def get(self, doc_id: str) -> Document | None:
        return self._by_id.get(doc_id)

    def search(self, query: str, top_k: int) -> list[SearchHit]:
        """The top_k documents by BM25 score (documents sharing no term are left out)."""
        terms = tokenize(query)
        scores: dict[int, float] = defaultdict(float)
        n = len(self.documents)
        for term in set(terms):
            postings = self._postings.get(term, [])
            if not postings:
                continue
            idf = math.log(1 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
            for index, count in postings:
                norm = self.k1 * (1 - self.b + self.b * self._lengths[index] / self._average_length)
                scores[index] += idf * count * (self.k1 + 1) / (count + norm)
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:top_k]
        return [SearchHit(self.documents[i], score, snippet(self.documents[i].text, terms)) for i, score in ranked]


def snippet(text: str, query_terms: list[str], limit: int = SNIPPET_CHARS) -> str:
    """The sentence sharing most terms with the query (with its neighbour), cut to limit."""
    sentences = [s for s in _SENTENCE.split(text.strip()) if s]
    if not sentences:
        return ""
    wanted = set(query_terms)
    best = max(range(len(sentences)), key=lambda i: (len(wanted & set(tokenize(sentences[i]))), -i))
    chosen = " ".join(sentences[best : best + 2])
    chosen = " ".join(chosen.split())
    return chosen if len(chosen) <= limit else chosen[: limit - 1].rstrip() + "…"


# --- reading and ingesting files -------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "doc"


def read_jsonl(path: Path) -> list[Document]:
    """Documents from JSONL lines with "text" and optional "id", "title", "url"."""
    documents = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        if not isinstance(record, dict) or not str(record.get("text", "")).strip():
            raise CorpusError(f"{path}:{number}: needs an object with a non-empty \"text\"")
        title = str(record.get("title") or record["text"][:60])
        doc_id = str(record.get("id") or f"{_slug(path.stem)}-{number}")
        documents.append(Document(doc_id, title, str(record["text"]), str(record.get("url", ""))))
    return documents


def read_text_file(path: Path) -> Document:
    """One document from a text or Markdown file; a leading "# " heading is its title."""
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    if not text:
        raise CorpusError(f"{path}: empty")
    title = path.stem.replace("_", " ").replace("-", " ")
    if path.suffix.lower() in MARKDOWN_SUFFIXES:
        first, _, rest = text.partition("\n")
        if first.startswith("# "):
            title, text = first[2:].strip(), rest.strip() or first[2:].strip()
    return Document(_slug(path.stem), title, text)


def read_documents(path: Path) -> list[Document]:
    """Documents from a file, or from every supported file under a directory."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and _supported(p))
        return [doc for file in files for doc in read_documents(file)]
    if not path.is_file():
        raise CorpusError(f"{path}: no such file or directory")
    if path.suffix.lower() in JSONL_SUFFIXES:
        return read_jsonl(path)
    if _supported(path):
        return [read_text_file(path)]
    raise CorpusError(f"{path}: not .txt, .md or .jsonl")


def _supported(path: Path) -> bool:
    return path.suffix.lower() in TEXT_SUFFIXES | MARKDOWN_SUFFIXES | JSONL_SUFFIXES


def add_to_corpus(source: Path, corpus_dir: Path) -> tuple[Path, int]:
    """Ingests source into corpus_dir as one JSONL file; returns it and the document count."""
    documents = read_documents(source)
    if not documents:
        raise CorpusError(f"{source}: no documents found")
    corpus_dir.mkdir(parents=True, exist_ok=True)
    target = corpus_dir / f"{_slug(source.stem)}.jsonl"
    with target.open("w", encoding="utf-8") as f:
        for doc in documents:
            f.write(json.dumps({"id": doc.id, "title": doc.title, "text": doc.text, "url": doc.url}, ensure_ascii=False) + "\n")
    return target, len(documents)


def corpus_dir_of(settings: Settings) -> Path:
    """Where ingested documents live: sandbox.corpus_dir, else data_dir/corpus."""
    return settings.sandbox.corpus_dir or settings.data_dir / "corpus"


def ingest(path: str | Path, settings: Settings) -> str:
    """`gearshift corpus add PATH`: ingests and says what it did (the service loads it at start)."""
    target, count = add_to_corpus(Path(path), corpus_dir_of(settings))
    return f"added {count} document{'s' if count != 1 else ''} to {target}; restart the sandbox to search them"


def load_corpus(corpus_dir: Path | None, include_sample: bool) -> Corpus:
    """The sample corpus (optionally) plus every JSONL file in corpus_dir."""
    documents = read_jsonl(SAMPLE_CORPUS) if include_sample else []
    if corpus_dir is not None and corpus_dir.is_dir():
        for file in sorted(corpus_dir.glob("*.jsonl")):
            documents += read_jsonl(file)
    return Corpus(documents)
