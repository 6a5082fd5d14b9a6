"""The installed package: every source package of the repository is in the wheel, under the rtvoice name,
and the wheel, installed into a fresh environment, serves the page from any directory."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import httpx

from testkit.servers import start_rtvoice

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


def _installed_site_packages(python: Path) -> Path:
    return Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )


def test_the_wheel_installs_and_serves_the_page_from_any_directory(tmp_path: Path) -> None:
    """Build the wheel from the sources alone, install it into a fresh venv, run ``rtvoice serve`` elsewhere."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for directory in _setuptools_table()["package-dir"].values():  # type: ignore[union-attr]
        shutil.copytree(REPO / directory, source / directory, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = tmp_path / "wheels"
    # No build isolation: setuptools>=77 comes with the test extra, so the build needs no download.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("rtvoice-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"rtvoice"}, (
        "the wheel must install everything under rtvoice/, nothing at the top of site-packages"
    )
    assert {"rtvoice/web/index.html", "rtvoice/web/app.js", "rtvoice/web/style.css"} <= set(names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = _installed_site_packages(python)
    # The dependencies: this test environment's site-packages, after the venv's own (a .pth adds them to
    # sys.path without running their .pth files, so this checkout's editable install stays out).
    (site_packages / "test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": ""}
    where = subprocess.run(
        [str(python), "-c", "import rtvoice.app, rtvoice.web; print(rtvoice.app.__file__)"],
        cwd=elsewhere,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert Path(where.strip()).is_relative_to(site_packages), where
    assert not (site_packages / "app").exists() and not (site_packages / "engine").exists()
    version = subprocess.run(
        [str(venv / "bin" / "rtvoice"), "--version"], cwd=elsewhere, env=env, check=True, capture_output=True, text=True
    ).stdout
    assert version.strip() == f"rtvoice {tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['version']}"

    server = start_rtvoice(
        {"RTVOICE_WARMUP": "false", "PYTHONPATH": ""}, command=[str(venv / "bin" / "rtvoice"), "serve"], cwd=elsewhere
    )
    try:
        page = httpx.get(f"{server.url}/")
        assert page.status_code == 200 and "<title>rtvoice</title>" in page.text
        script = httpx.get(f"{server.url}/web/app.js")
        assert script.status_code == 200 and script.content == (REPO / "web" / "app.js").read_bytes()
        docs = httpx.get(f"{server.url}/docs")
        assert docs.status_code == 200
        (swagger_js,) = re.findall(r'src="(/[^"]*swagger-ui-bundle\.js)"', docs.text)
        assert httpx.get(f"{server.url}{swagger_js}").status_code == 200
    finally:
        server.stop()
