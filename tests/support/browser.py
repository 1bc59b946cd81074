"""The browser the dashboard tests drive: Debian's Chromium, headless, through Playwright."""

from __future__ import annotations

import os

import pytest

from tests.support import scaled

CHROMIUM = "/usr/bin/chromium"
needs_browser = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                   reason=f"no browser: {CHROMIUM} is absent (apt-get install chromium)")
# Collects what the browser refused under the page's Content-Security-Policy; runs before any page script.
RECORD_CSP_VIOLATIONS = ("window.cspViolations = []; document.addEventListener('securitypolicyviolation', "
                         "(e) => window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));")


def ms(seconds: float) -> float:
    return scaled(seconds) * 1000
