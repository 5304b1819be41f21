"""A real headless browser for tests of the report page: Debian's Chromium through Selenium.

`ensure_chromium` makes sure the browser and its driver are there (installing Debian's
``chromium`` and ``chromium-driver`` when running as root, as CI containers do) or says why
not; `headless_chrome` starts a driver that keeps the page's console log for inspection.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APT_PACKAGES = ("chromium", "chromium-driver")


def _present() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


def ensure_chromium() -> str | None:
    """None when Chromium and chromedriver are ready, else why they are not.

    Installs them with apt-get when missing and this process is root (``apt-get update``
    first only if the plain install fails, since the package lists may be current).
    """
    if _present():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install {' '.join(APT_PACKAGES)})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=600"]  # the slurm tier may be installing in parallel
    install = ["apt-get", "install", "-y", "-q", *wait, *APT_PACKAGES]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        update = ["apt-get", "update", "-q", *wait]
        subprocess.run(update, env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return f"apt-get install {' '.join(APT_PACKAGES)} failed: {done.stderr[-500:]}"
    return None if _present() else f"{CHROMIUM} or {CHROMEDRIVER} still missing after install"


def headless_chrome(width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium WebDriver that records the browser console (all levels)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
