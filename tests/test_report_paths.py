"""Reports carry no machine paths (lm/report/paths.py): what lm report writes reads the same on any machine."""

import os

from lm.report.paths import portable


def test_machine_paths_become_portable(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LM_DATA_MIRROR", "/srv/mirror")
    monkeypatch.setenv("LM_CACHE", str(tmp_path / ".ci-cache"))
    home = os.path.expanduser("~")
    text = (
        f"lm report runs -o {tmp_path}/docs/ablations/x; data.dir={tmp_path}/.ci-cache/data/char; "
        f"LM_DATA_MIRROR=/srv/mirror; run {home}/elsewhere/run"
    )
    assert portable(text) == (
        "lm report runs -o docs/ablations/x; data.dir=$LM_CACHE/data/char; "
        "LM_DATA_MIRROR=$LM_DATA_MIRROR; run ~/elsewhere/run"
    )
