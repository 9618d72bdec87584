"""The library stays below the applications: no module of libs/gearshift imports a service
(services/), a training job (training-jobs/) or the test-support package, except the
command-line entry point (gearshift.cli), which sits above them all. Services and jobs are
reached by name through their tables (gearshift.topology, gearshift.job_table)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gearshift

from tests.libs.test_import_cycles import import_statements

LIBRARY = Path(gearshift.__file__).parent
APPLICATIONS = ("gearshift.services", "gearshift.jobs", "gearshift.testing")
EXEMPT = ("api", "cli", "testing")  # generated code, the entry point, the test support itself


def imported_modules(source: str, package: str) -> set[str]:
    """Every module an import statement in source names (relative ones resolved)."""
    found = set()
    for base, names in import_statements(source, package):
        found.add(base)
        found.update(f"{base}.{name}" for name in names)
    return found


def violations(source: str, package: str) -> list[str]:
    return sorted(m for m in imported_modules(source, package) if m.startswith(APPLICATIONS))


def library_modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(LIBRARY).with_suffix("").parts
        if parts[0] in EXEMPT:
            continue
        modules[".".join(("gearshift", *parts)).removesuffix(".__init__")] = path
    return modules


def test_the_library_imports_no_application():
    modules = library_modules()
    assert "gearshift.settings" in modules and "gearshift.embedded" in modules and len(modules) > 60
    found = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        if bad := violations(path.read_text(), package):
            found[name] = bad
    assert found == {}


def test_the_check_sees_every_form_of_import():
    package = "gearshift.evaluation"
    assert violations("from gearshift.services.sandbox import corpus", package) == [
        "gearshift.services.sandbox", "gearshift.services.sandbox.corpus"]
    assert violations("def f():\n    import gearshift.jobs.apo.trainer\n", package) == ["gearshift.jobs.apo.trainer"]
    assert violations("from gearshift import testing", package) == ["gearshift.testing"]
    assert violations("from ..testing.scripted_policy import serve_scripted", package) == [
        "gearshift.testing.scripted_policy", "gearshift.testing.scripted_policy.serve_scripted"]
    assert violations("from gearshift import settings, weights\nimport grpc", package) == []


def test_settings_load_without_training_code():
    """Every service reads settings: they check job names against gearshift.job_table, not the
    training package, and never pull in torch."""
    loaded = "import sys, gearshift.settings; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('gearshift.training')))"
    done = subprocess.run([sys.executable, "-c", loaded], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
