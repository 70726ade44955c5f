"""The report opened in a real browser: Debian's headless Chromium, driven by selenium through its chromedriver.

Checked: every section the report lists rendered (present, visible, taller than its heading), every image
loaded (``naturalWidth > 0``), and the page fetched nothing (no resource entries: images are ``data:``
URIs). Skipped only when Chromium or its driver is not installed, unless ``IMGSHARDS_REQUIRE_BROWSER`` is
set (``.ci/run`` installs both and sets it), which makes their absence a failure.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from beam_jobs.options import ConvertOptions
from beam_jobs.pipeline import run
from reader.tools import report

pytestmark = pytest.mark.e2e  # starts chromedriver and Chromium

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FAST = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _browser_or_skip(user_data_dir):
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        reason = (f"{' and '.join(missing)} not installed (Debian: apt-get install chromium chromium-driver; "
                  ".ci/run installs them)")
        if os.environ.get("IMGSHARDS_REQUIRE_BROWSER"):
            pytest.fail(reason + " and IMGSHARDS_REQUIRE_BROWSER is set")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--window-size=1200,900",
                 f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    # The driver named explicitly: selenium-manager never runs, so nothing is downloaded.
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _check_page(driver, url: str, sections: list[str]) -> None:
    driver.get(url)
    found = driver.execute_script("""
        const sections = Array.from(document.querySelectorAll('section')).map(s => ({
            id: s.id, height: s.getBoundingClientRect().height,
            heading: s.querySelector('h2').getBoundingClientRect().height,
            visible: s.offsetParent !== null}));
        const images = Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete,
                                                              width: i.naturalWidth}));
        return {sections, images, resources: performance.getEntriesByType('resource').map(r => r.name)};
    """)
    assert [s["id"] for s in found["sections"]] == sections
    for section in found["sections"]:
        assert section["visible"] and section["height"] > section["heading"] + 10, section
    assert found["images"], "no image on the page"
    broken = [image for image in found["images"] if not image["complete"] or image["width"] <= 0]
    assert not broken, broken
    assert found["resources"] == []


def test_the_reports_of_a_classification_and_an_object_dataset_render_every_section_in_chromium(tmp_path):
    from converter.demo import write_demo, write_object_demo

    write_demo(str(tmp_path / "shapes"), per_class=4, seed=1)  # every section still drawn
    write_object_demo(str(tmp_path / "coco"), "coco", images=10, seed=1)
    pages = []
    for name, extra in (("shapes", {"val_fraction": 0.25}), ("coco", {})):
        out = str(tmp_path / f"{name}-out")
        run(ConvertOptions(src=str(tmp_path / name), out=out, shards=1, **extra), FAST, show_progress=False)
        paths = report.write_report(out)
        pages.append((pathlib.Path(paths.html).as_uri(), json.loads(pathlib.Path(paths.json).read_text())["sections"]))
    assert "objects" in pages[1][1]
    driver = _browser_or_skip(tmp_path / "profile")
    try:
        for url, sections in pages:
            _check_page(driver, url, sections)
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)
