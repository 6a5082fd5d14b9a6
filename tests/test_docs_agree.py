"""The settings class, ``.env.example`` and the README's configuration table agree: names and defaults."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rtvoice.app.settings import Settings

REPO = Path(__file__).resolve().parent.parent
ENV_EXAMPLE = REPO / ".env.example"
README = REPO / "README.md"
VARIABLE = re.compile(r"\bRTVOICE_([A-Z0-9_]+)\b")
SETTINGS = {f"RTVOICE_{name.upper()}": name for name in Settings.model_fields}


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RTVOICE_* variable and no XDG_DATA_HOME from the caller's environment, so defaults are the class's."""
    for name in list(os.environ):
        if name.startswith("RTVOICE_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)


def as_configured(monkeypatch: pytest.MonkeyPatch, variable: str, text: str) -> object:
    """The value a setting takes when its variable holds ``text``, parsed as the environment is."""
    with monkeypatch.context() as patch:
        patch.setenv(variable, text)
        return getattr(Settings(_env_file=None), SETTINGS[variable])


def test_env_example_lists_every_setting_with_its_default(clean_environment: None) -> None:
    text = ENV_EXAMPLE.read_text()
    listed = set(re.findall(r"^(?:# )?(RTVOICE_[A-Z0-9_]+)=", text, flags=re.MULTILINE))
    assert listed == set(SETTINGS), (
        f"missing from .env.example: {sorted(set(SETTINGS) - listed)}; not settings: {sorted(listed - set(SETTINGS))}"
    )
    # Read .env.example as an env file: each uncommented value must be the default.
    defaults = Settings(_env_file=None)
    example = Settings(_env_file=ENV_EXAMPLE)
    assigned = re.findall(r"^(RTVOICE_[A-Z0-9_]+)=", text, flags=re.MULTILINE)
    assert assigned, "no uncommented settings in .env.example"
    for variable in assigned:
        name = SETTINGS[variable]
        assert getattr(example, name) == getattr(defaults, name), f"{variable} in .env.example is not the default"


def test_readme_names_only_settings_that_exist() -> None:
    for document in (README, REPO / "Dockerfile", REPO / "docs" / "architecture.md"):
        unknown = {f"RTVOICE_{name}" for name in VARIABLE.findall(document.read_text())} - set(SETTINGS)
        assert not unknown, f"{document.name} names settings that do not exist: {sorted(unknown)}"


def readme_configuration_rows() -> list[tuple[list[str], list[str]]]:
    """(variables, default cells) of each row of the README's configuration table."""
    section = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        variables = re.findall(r"`(RTVOICE_[A-Z0-9_]+)`", cells[0]) if len(cells) == 3 else []
        if variables:
            defaults = [cells[1]] if len(variables) == 1 else [part.strip() for part in cells[1].split(",")]
            assert len(defaults) == len(variables), f"one default per variable: {line}"
            rows.append((variables, defaults))
    return rows


def test_readme_configuration_table_shows_the_defaults(
    clean_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = readme_configuration_rows()
    assert len(rows) >= 8
    defaults = Settings(_env_file=None)
    for variables, cells in rows:
        for variable, cell in zip(variables, cells, strict=True):
            assert variable in SETTINGS, f"README's table names {variable}, which is not a setting"
            default = getattr(defaults, SETTINGS[variable])
            literal = re.fullmatch(r"`([^`]*)`", cell)
            if literal is None:  # words such as "embedded voice" or "—" stand for an unset setting
                assert default in (None, ""), f"README shows {cell!r} for {variable}, whose default is {default!r}"
            else:
                shown = os.path.expanduser(literal.group(1))
                assert as_configured(monkeypatch, variable, shown) == default, (
                    f"README shows {cell} for {variable}; the default is {default!r}"
                )
