"""codeyard.toml [deploy] numbers: TOML spells inf and nan, and integers past any real count; each is a
clear error naming the setting, never an app started with a nonsense size (issue 14, defect 3 sweep)."""

from __future__ import annotations

import pytest

from deploy_service.detect import detect


@pytest.mark.parametrize("setting", ["instances = inf", "instances = nan", "instances = 0", "instances = 2.0",
                                     "instances = 9223372036854775807", "memory_mb = inf", "memory_mb = -inf",
                                     "memory_mb = nan", "memory_mb = 1e400", "memory_mb = 0", "memory_mb = -512"])
def test_deploy_numbers_that_are_not_whole_numbers_in_range_name_the_setting(tmp_path, setting):
    (tmp_path / "index.html").write_text("<p>hi</p>")
    (tmp_path / "codeyard.toml").write_text(f"[deploy]\n{setting}\n")
    with pytest.raises(ValueError, match=f"codeyard.toml: deploy.{setting.split()[0]} must be a whole number from"):
        detect(tmp_path)


@pytest.mark.parametrize("setting", ["cpus = inf", "cpus = nan", "cpus = 0", "cpus = 0.05", "cpus = 5", "cpus = true",
                                     'cpus = "1"'])
def test_deploy_cpus_out_of_range_name_the_setting(tmp_path, setting):
    (tmp_path / "index.html").write_text("<p>hi</p>")
    (tmp_path / "codeyard.toml").write_text(f"[deploy]\n{setting}\n")
    with pytest.raises(ValueError, match="codeyard.toml: deploy.cpus must be a number from 0.1 to 4"):
        detect(tmp_path)


def test_deploy_cpus_reach_the_plan(tmp_path):
    (tmp_path / "index.html").write_text("<p>hi</p>")
    (tmp_path / "codeyard.toml").write_text("[deploy]\ncpus = 0.5\n")
    assert detect(tmp_path).cpus == 0.5
    (tmp_path / "codeyard.toml").write_text("[deploy]\n")
    assert detect(tmp_path).cpus == 1.0
