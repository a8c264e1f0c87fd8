"""Fixtures for the lab tests (pytest -m lab)."""

from __future__ import annotations

import pytest

from tests.e2e.lab import Lab, sshd_available


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not sshd_available():
        pytest.fail("the lab needs OpenSSH's sshd: run the tests with scripts/test, which installs it "
                    "(or apt-get install openssh-server)")
    lab = Lab(tmp_path_factory.mktemp("lab")).start()
    yield lab
    lab.stop()
