"""``Deployment.upgrade``, ``rollback`` and ``history`` from Python: the same core as
``spark-deploy upgrade``/``rollback``/``history`` (whose every case runs on the testbed in
``crates/spark-deploy-testbed/tests/upgrade.rs``). Here: the typed errors and the history's shape,
with no testbed — the worker is ``root@127.0.0.1`` on port 1, where nothing listens.
"""

import json
import pathlib
import tempfile

import pytest

import spark_deploy


def config(state_dir, **serving):
    d = spark_deploy.Config.load(None, env={}).to_dict()
    d["deployment"]["name"] = "pytest-py-upgrade"  # no real deployment carries this name
    d["deployment"]["state_dir"] = str(state_dir)
    d["nodes"][1].update(
        ssh="root@127.0.0.1",
        ssh_port=1,
        identity_file="/nonexistent/spark-deploy-test/id_ed25519",
        known_hosts="/nonexistent/spark-deploy-test/known_hosts",
    )
    d["serving"].update(serving)
    return spark_deploy.Config.from_dict(d)


def test_nothing_serving_is_refused_with_a_remedy_and_nothing_changes():
    state = pathlib.Path(tempfile.mkdtemp(prefix="spark-deploy-pytest-upgrade-"))
    dep = spark_deploy.Deployment(config(state))
    assert dep.history() == []
    new = config(state, max_tokens=8192)
    with pytest.raises(spark_deploy.UpgradeError) as e:
        dep.upgrade(new)
    assert "no generation is recorded as serving" in str(e.value)
    assert "spark-deploy up" in e.value.remedy
    assert e.value.restored is None
    assert isinstance(e.value, spark_deploy.SparkDeployError)
    with pytest.raises(spark_deploy.UpgradeError) as e:
        dep.rollback()
    assert "no earlier generation" in str(e.value) and e.value.remedy
    # Nothing was written: no history, no watch lease.
    assert not (state / "generations.json").exists()
    assert not (state / "watch" / "pause").exists()


def test_history_lists_the_recorded_generations():
    state = pathlib.Path(tempfile.mkdtemp(prefix="spark-deploy-pytest-upgrade-"))
    gen = {
        "id": 1,
        "state": "superseded",
        "config": {},
        "config_sha256": "a" * 64,
        "fingerprint": "fp1",
        "model_commit": "c" * 40,
        "images": ["img:fp-fp1", "img:fp-fp1"],
        "served_from": 100,
        "served_until": 200,
        "figures": {"decode_tps": 50.0, "prefill_tps": 2100.0},
    }
    later = dict(gen, id=2, state="serving", fingerprint="fp2", served_from=200)
    del later["served_until"]
    (state / "generations.json").write_text(json.dumps({"generations": [gen, later]}))
    h = spark_deploy.Deployment(config(state)).history()
    assert [g["id"] for g in h] == [1, 2]
    assert [g["state"] for g in h] == ["superseded", "serving"]
    assert h[0]["figures"] == {"decode_tps": 50.0, "prefill_tps": 2100.0}
    # A bad config for the new generation is a ConfigError before anything runs.
    with pytest.raises(spark_deploy.ConfigError):
        spark_deploy.Deployment(config(state)).upgrade(config(state, port=0))
