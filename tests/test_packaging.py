"""The installed package: every source package of the repository is in the wheel, under the rtvoice name."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _setuptools_table() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_source_package_is_listed() -> None:
    table = _setuptools_table()
    listed = set(table["packages"])  # type: ignore[arg-type]
    package_dir: dict[str, str] = table["package-dir"]  # type: ignore[assignment]
    on_disk = set()
    for name, directory in package_dir.items():
        root = REPO / directory
        if not (root / "__init__.py").exists():
            continue  # a data-only package such as the page
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root).parts
            on_disk.add(".".join((name, *relative)))
    missing = on_disk - listed
    assert not missing, f"packages missing from pyproject.toml's [tool.setuptools] packages: {sorted(missing)}"
