"""Maps the repository layout onto one import tree: libs/gearshift -> gearshift,
services/<name> -> gearshift.services.<name>, training-jobs/<job> -> gearshift.jobs.<job>."""
from setuptools import find_packages, setup

ROOTS = {"gearshift": "libs/gearshift", "gearshift.services": "services", "gearshift.jobs": "training-jobs"}

packages = []
for prefix, path in ROOTS.items():
    packages += [prefix] + [f"{prefix}.{name}" for name in find_packages(path)]

setup(
    packages=packages,
    package_dir=ROOTS,
    package_data={
        "": ["*.pyi", "*.ini", "*.mako", "*.jsonl", "*.md", "*.jinja", "py.typed"],
        "gearshift": ["default_policy/*"],  # the shipped adapter and its model card (a folder, not a package)
    },
)
