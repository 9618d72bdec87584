"""Corpus loading, BM25 ranking, snippets, and `gearshift corpus add`."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from gearshift.cli import main
from gearshift.services.sandbox.corpus import (
    Corpus,
    CorpusError,
    Document,
    add_to_corpus,
    load_corpus,
    read_documents,
    snippet,
)


def test_bundled_sample_has_a_few_dozen_unique_documents():
    corpus = load_corpus(None, include_sample=True)
    assert 30 <= len(corpus) <= 60
    assert len({d.id for d in corpus.documents}) == len(corpus)
    assert all(d.title and d.text for d in corpus.documents)


def test_bm25_matches_a_hand_computed_score():
    corpus = Corpus([Document("a", "cats", "cats purr"), Document("b", "dogs", "dogs bark loudly"), Document("c", "birds", "birds sing")])
    hits = corpus.search("cats", top_k=3)
    assert [h.document.id for h in hits] == ["a"]
    # tf("cats") = 2 (title + text), |a| = 3, avgdl = 10/3, n = 3, df = 1
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    norm = 1.5 * (1 - 0.75 + 0.75 * 3 / (10 / 3))
    assert hits[0].score == pytest.approx(idf * 2 * 2.5 / (2 + norm))


def test_rarer_terms_weigh_more_and_stopwords_do_not_count():
    corpus = Corpus([
        Document("1", "x", "the river flows north"), Document("2", "y", "the river delta"),
        Document("3", "z", "a glacier feeds the river"),
    ])
    assert corpus.search("glacier river", top_k=1)[0].document.id == "3"
    assert corpus.search("the of and", top_k=5) == []


def test_snippet_picks_the_sentence_with_the_query_terms():
    text = "Intro sentence here. The answer is forty two. Something else entirely. More filler."
    assert snippet(text, ["answer"]) == "The answer is forty two. Something else entirely."
    assert len(snippet("word " * 500, ["word"], limit=50)) == 50


def test_reading_text_markdown_and_jsonl(tmp_path):
    (tmp_path / "notes.txt").write_text("Plain text about otters.")
    (tmp_path / "guide.md").write_text("# Otter guide\n\nOtters eat fish.")
    (tmp_path / "more.jsonl").write_text(json.dumps({"id": "j1", "title": "Seals", "text": "Seals swim."}) + "\n\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    docs = {d.id: d for d in read_documents(tmp_path)}
    assert set(docs) == {"notes", "guide", "j1"}
    assert docs["guide"].title == "Otter guide" and docs["guide"].text == "Otters eat fish."
    assert docs["j1"].title == "Seals"


def test_bad_jsonl_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    with pytest.raises(CorpusError, match="bad.jsonl:2"):
        read_documents(bad)
    pdf = tmp_path / "x.pdf"
    pdf.write_text("x")
    with pytest.raises(CorpusError, match="not .txt, .md or .jsonl"):
        read_documents(pdf)


def test_added_documents_are_searchable_next_to_the_sample(tmp_path):
    source = tmp_path / "zebras.md"
    source.write_text("# Zebras\n\nZebras have black and white stripes.")
    target, count = add_to_corpus(source, tmp_path / "corpus")
    assert count == 1 and target.name == "zebras.jsonl"
    corpus = load_corpus(tmp_path / "corpus", include_sample=True)
    assert corpus.search("zebra stripes", top_k=1)[0].document.id == "zebras"
    assert corpus.get("canberra") is not None


def test_corpus_add_command(tmp_path, monkeypatch):
    monkeypatch.setenv("GEARSHIFT_DATA_DIR", str(tmp_path / "data"))
    from gearshift.settings import get_settings

    get_settings.cache_clear()
    try:
        source = tmp_path / "facts.jsonl"
        source.write_text("\n".join(json.dumps({"text": t}) for t in ("One fact.", "Two facts.")))
        result = CliRunner().invoke(main, ["corpus", "add", str(source)])
        assert result.exit_code == 0, result.output
        assert "added 2 documents" in result.output
        assert len((tmp_path / "data" / "corpus" / "facts.jsonl").read_text().splitlines()) == 2
        empty = tmp_path / "empty.txt"
        empty.write_text("   ")
        failed = CliRunner().invoke(main, ["corpus", "add", str(empty)])
        assert failed.exit_code == 1 and "empty" in failed.output
    finally:
        get_settings.cache_clear()
