"""The report page in a real headless browser: every plot draws, offline, without console errors.

The page is opened from disk (``file://``) in Chromium, which has no network access to fetch
anything from, so a plot that relied on a CDN, or a script error, shows up as a plot without
its SVG or as a SEVERE console entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lcab.report.build import BuiltReport, build_report
from tests.helpers.browser import ensure_chromium, headless_chrome
from tests.helpers.synthetic_records import example_sweeps

pytestmark = pytest.mark.slow

RENDERED = """
const plots = [...document.querySelectorAll('.js-plotly-plot')];
return plots.filter(p => p.querySelector('.main-svg') !== null).length;
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = ensure_chromium()
    if missing:
        pytest.skip(missing)
    driver = headless_chrome()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> BuiltReport:
    kernels, cp = example_sweeps(tmp_path_factory.mktemp("sweeps"))
    return build_report([kernels, cp])


def test_every_plot_renders_offline_without_console_errors(browser, report):
    from selenium.webdriver.support.ui import WebDriverWait

    assert report.omitted == []  # the example sweeps give every figure data
    browser.get(Path(report.index).resolve().as_uri())
    expected = len(report.figures)
    WebDriverWait(browser, 60).until(lambda d: d.execute_script(RENDERED) == expected)
    total = browser.execute_script("return document.querySelectorAll('.js-plotly-plot').length")
    assert total == expected
    for name in report.figures:
        assert browser.execute_script(
            "return document.getElementById(arguments[0]).querySelector('.main-svg') !== null",
            f"plot-{name}",
        ), name
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
