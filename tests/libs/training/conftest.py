"""A tiny random checkpoint with the real SmolLM2 tokenizer, made once per session."""

import pytest
from gearshift.training.tiny import tiny_checkpoint
from transformers import AutoTokenizer


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("training") / "tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
