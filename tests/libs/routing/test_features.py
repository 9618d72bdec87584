"""Lexical features on hand-checked queries, the embeddings, and the training config file."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gearshift.jobs.router.config import RouterConfig
from gearshift.routing.features import LEXICAL_FEATURES, FeatureSpec, extractor_for, lexical_features


def named(query: str) -> dict[str, float]:
    return dict(zip(LEXICAL_FEATURES, lexical_features(query).tolist()))


def test_lexical_features_by_hand():
    f = named("How many is 12,345 * 6.5?")
    assert f["log_numbers"] == pytest.approx(math.log1p(2))
    assert f["max_number_digits"] == 5 and f["max_number_log10"] == pytest.approx(math.log10(12_346))
    assert f["has_decimal"] == 1 and f["has_expression"] == 1 and f["log_operators"] == pytest.approx(math.log1p(1))
    assert f["question_how"] == 1 and f["question_how_many"] == 1 and f["question_what"] == 0
    assert f["ends_with_question_mark"] == 1 and f["log_digits"] == pytest.approx(math.log1p(7))
    fact = named("Who wrote Hamlet")
    assert fact["question_who"] == 1 and fact["log_numbers"] == 0 and fact["ends_with_question_mark"] == 0
    assert named("9" * 400)["max_number_log10"] == 308.0  # too big for a float: capped, still finite


def test_static_embedding_is_normalised_and_meaningful():
    extractor = extractor_for(FeatureSpec(embedding="static"))
    rows = extractor.transform_many(["capital of France", "capital of Spain", "17 * 23 ="])
    assert rows.shape == (3, FeatureSpec(embedding="static").dim)
    emb = rows[:, :384]
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0)
    assert emb[0] @ emb[1] > emb[0] @ emb[2]


@pytest.mark.slow
def test_minilm_sentence_embedding_separates_topics():
    extractor = extractor_for(FeatureSpec(embedding="minilm"))
    emb = extractor.transform_many(["What is the capital of France?", "Which city is France's capital?", "Compute 98765 * 4321."])[:, :384]
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert emb[0] @ emb[1] > 0.7 > emb[0] @ emb[2]
    np.testing.assert_allclose(extractor.transform("What is the capital of France?")[:384], emb[0], atol=1e-5)


def test_config_files(tmp_path):
    yaml = tmp_path / "router.yaml"
    yaml.write_text('task_source: basic_arithmetic\nrun_ids: [r1]\nembedding: static\nstore_addr: "127.0.0.1:50056"\noutput: {dir: /tmp/r}\n')
    config = RouterConfig.from_file(yaml)
    assert (config.task_source, config.run_ids, config.embedding, config.train_splits) == ("basic_arithmetic", ["r1"], "static", ["train"])
    bad = tmp_path / "bad.json"
    good = '"store_addr": "s:1", "output": {"dir": "/tmp/r"}'
    bad.write_text('{"train_splits": ["train", "dev"], "eval_split": "dev", ' + good + '}')
    with pytest.raises(ValueError, match="also a training split"):
        RouterConfig.from_file(bad)
    bad.write_text('{"embeding": "none", ' + good + '}')
    with pytest.raises(ValueError, match="embeding"):
        RouterConfig.from_file(bad)
    bad.write_text('{"output": {"dir": "/tmp/r"}}')
    with pytest.raises(ValueError, match="store_addr"):
        RouterConfig.from_file(bad)
