"""The docs stay true (issue 61): every `gearshift` command README.md, docs/*.md and the values
files' headers give parses with the command line's own parser, every helm command renders, and
every object and Secret they name is one the chart renders with the values they give
(tests/charts/docs_check.py says how each is found). Each kind of mistake, planted into a copy of
the docs, is reported."""

from __future__ import annotations

import pytest

from tests.charts.docs_check import Checker, commands, documents, split

TEXTS = list(documents())
OPERATIONS = dict(TEXTS)["docs/operations.md"]
QUICK_START_PORT_FORWARD = "# 4. The gateway on localhost:8100\nkubectl -n gearshift port-forward svc/gearshift-gateway 8100 &\n"


@pytest.fixture(scope="module")
def checker() -> Checker:
    return Checker(TEXTS)


def test_the_docs_give_commands_of_every_kind_the_checks_cover():
    found = [split(c.text)[:2] for where, text in TEXTS for c in commands(where, text)]
    programs = {words[0] for words in found if words}
    assert programs == {"gearshift", "helm", "kubectl"}
    assert ["helm", "install"] in found and ["helm", "upgrade"] in found
    assert sum(words[0] == "gearshift" for words in found if words) >= 40


def test_every_documented_command_name_and_secret_is_true(checker):
    assert checker.failed == {}, "documented helm commands that do not render"
    problems = [problem for where, text in TEXTS for problem in checker.check(where, text)]
    assert problems == []


def test_the_secrets_the_docs_create_are_ones_the_documented_values_make_the_chart_use(checker):
    assert {"gearshift-token", "gearshift-database", "gearshift-redis", "gearshift-api-keys"} <= checker.rendered.used_secrets


def planted(old: str, new: str) -> str:
    """docs/operations.md with one line changed."""
    assert OPERATIONS.count(old) == 1, old
    return OPERATIONS.replace(old, new)


@pytest.mark.parametrize(("line", "says"), [
    ("gearshift router train --config router.json\n", "No such command 'router'"),
    (".venv/bin/gearshift keys mint laptop --file api-keys.json\n", "No such command 'mint'"),
])
def test_a_planted_wrong_command_is_reported(checker, line, says):
    problems = checker.check("docs/operations.md", planted(QUICK_START_PORT_FORWARD, QUICK_START_PORT_FORWARD + line))
    assert len(problems) == 1 and says in problems[0], problems


@pytest.mark.parametrize(("line", "says"), [
    (".venv/bin/gearshift keys new laptop --file api-keys.json --rotate\n", "No such option '--rotate'"),
    ("gearshift up --base-port many\n", "'many' is not a valid integer"),
    ("gearshift train sft\n", "Missing option '--config'"),
])
def test_a_planted_wrong_option_is_reported(checker, line, says):
    problems = checker.check("docs/operations.md", planted(QUICK_START_PORT_FORWARD, QUICK_START_PORT_FORWARD + line))
    assert len(problems) == 1 and says in problems[0], problems


@pytest.mark.parametrize(("old", "new", "says"), [
    (QUICK_START_PORT_FORWARD, "kubectl -n gearshift port-forward svc/gearshift-gatewy 8100 &\n", "no Service gearshift-gatewy"),
    (QUICK_START_PORT_FORWARD, "kubectl port-forward svc/gearshift-gateway 8100 &\n", "kubectl without -n"),
    ("Helm hook Job, `gearshift-store-migrate`,", "Helm hook Job, `myrel-gearshift-store-migrate`, `gearshift-store-migration`,",
     "`gearshift-store-migration`: no object of that name"),
    ("kubectl -n gearshift get secret gearshift-auth", "kubectl -n gearshift get secret gearshift-authn", "no Secret gearshift-authn"),
    ("Helm hook Job, `gearshift-store-migrate`,", "Helm hook Job, `<release>-gearshift-store-migrate`,", "write the name the chart renders"),
])
def test_a_planted_wrong_name_is_reported(checker, old, new, says):
    problems = checker.check("docs/operations.md", planted(old, new))
    assert len(problems) == 1 and says in problems[0], problems


@pytest.mark.parametrize(("old", "new", "says"), [
    ("create secret generic gearshift-token ", "create secret generic gearshift-tokens ", "Secret gearshift-tokens: no values the docs give"),
    ("create secret generic gearshift-api-keys --from-file=api-keys.json\n", "create secret generic gearshift-auth --from-file=api-keys.json\n",
     "Secret gearshift-auth: the chart makes it itself"),
])
def test_a_planted_wrong_secret_is_reported(checker, old, new, says):
    problems = checker.check("docs/operations.md", planted(old, new))
    assert len(problems) == 1 and says in problems[0], problems


def test_a_planted_helm_command_that_does_not_render_is_reported(checker):
    old = "  -f charts/gearshift/values-cpu.yaml --wait --timeout 15m\n"
    problems = checker.check("docs/operations.md", planted(old, "  -f charts/gearshift/values-cpu.yaml --set sandbox.seccomp.profile=Unconfined\n"))
    assert len(problems) == 1 and "helm cannot render it" in problems[0] and "sandbox.seccomp.profile" in problems[0], problems
