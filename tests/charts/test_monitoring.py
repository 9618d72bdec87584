"""The chart's dashboards and alerts: optional and off by default, the rules promtool checks and
unit-tests are the ones the PrometheusRule ships, every alert has a test that fires and
resolves and an on-call entry, every dashboard is a ConfigMap the Grafana sidecar loads."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from tests.charts.k8s import CHART, RELEASE, named, of_kind, render
from tests.charts.monitoring import BOARDS, DASHBOARDS, RULE_TESTS, RULES, alerts, dashboard, panel_queries, tool

MONITORING = ("ci/monitoring-values.yaml",)
OPERATIONS = (CHART.parents[1] / "docs" / "operations.md").read_text()


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent)


def test_promtool_checks_the_shipped_rules():
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in checked.stdout


def test_promtool_unit_tests_pass():
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_each_alert_has_a_unit_test_that_fires_and_resolves():
    cases = yaml.safe_load(RULE_TESTS.read_text())
    assert cases["rule_files"] == [RULES.name]
    for alert in alerts():
        checks = sorted((check for test in cases["tests"] for check in test.get("alert_rule_test", []) if check["alertname"] == alert["alert"]),
                        key=lambda check: duration(check["eval_time"]))
        fired = [n for n, check in enumerate(checks) if check["exp_alerts"]]
        assert fired, f"{alert['alert']}: no test where it fires"
        assert any(not check["exp_alerts"] for check in checks[fired[0] + 1:]), f"{alert['alert']}: no test where it resolves"


def duration(text: str) -> int:
    """Minutes of a promtool duration such as 1h20m or 45m."""
    return sum(int(n) * {"h": 60, "m": 1}[unit] for n, unit in re.findall(r"(\d+)([hm])", text))


def test_every_alert_has_a_runbook_entry_on_the_on_call_page():
    for alert in alerts():
        assert alert["annotations"]["runbook_url"] == f"docs/operations.md#{alert['alert'].lower()}"
        assert f"#### {alert['alert']}\n" in OPERATIONS, alert["alert"]
    for board in BOARDS:
        assert dashboard(board)["title"] in OPERATIONS, board


def test_the_prometheus_rule_ships_the_rules_file_as_it_is():
    rule = named(render(MONITORING), "PrometheusRule", f"{RELEASE}-alerts")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_dashboards_are_config_maps_for_the_grafana_sidecar():
    docs = render(MONITORING)
    for board in BOARDS:
        config_map = named(docs, "ConfigMap", f"{RELEASE}-dashboard-{board}")
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "monitoring" and config_map["metadata"]["annotations"] == {"grafana_folder": "gearshift"}
        assert json.loads(config_map["data"][f"gearshift-{board}.json"]) == dashboard(board)
    assert sorted(path.stem for path in DASHBOARDS.glob("*.json")) == sorted(BOARDS)


def test_dashboards_and_alerts_are_off_by_default():
    docs = render()
    assert not of_kind(docs, "PrometheusRule")
    assert not [doc for doc in of_kind(docs, "ConfigMap") if "grafana_dashboard" in doc["metadata"].get("labels", {})]


def test_every_panel_query_is_valid_promql(tmp_path):
    """Each panel's query as a recording rule, so promtool parses it (the live test runs them)."""
    rules = [{"record": f"panel:{n}", "expr": expr} for n, (_, _, expr) in enumerate(panel_queries())]
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    checked = subprocess.run([tool("promtool"), "check", "rules", str(tmp_path / "panels.yaml")], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_panel_has_a_unique_id_a_query_and_reads_the_datasource_variable():
    for board in BOARDS:
        content = dashboard(board)
        assert content["uid"] == f"gearshift-{board}" and content["templating"]["list"][0]["name"] == "datasource"
        ids = [panel["id"] for panel in content["panels"]]
        assert len(ids) == len(set(ids)), board
        for panel in content["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], (board, panel["title"])
    assert len(list(panel_queries())) >= 4 * len(BOARDS)
