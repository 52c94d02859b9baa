"""The Python module over the same plan: config loading, validation errors, plan descriptions."""

import json
import pathlib
import subprocess

import pytest

import spark_deploy

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB = ROOT / "crates" / "spark-deploy-py" / "spark_deploy.pyi"


def test_default_config_plans_every_step(tmp_path):
    config = spark_deploy.Config.load(None, env={})
    warnings = config.validate()
    assert any(w["field"] == "serving.context" for w in warnings)
    plan = spark_deploy.Plan.standard(config)
    assert plan.steps() == [
        "Preflight", "FetchCheckpoint", "BuildRankCache", "ConfigureWorkerStorage", "BuildImage", "LaunchRank", "Smoke",
    ]
    desc = plan.describe()
    assert desc["schema"] == "spark-deploy.plan/v1"
    launch = next(s for s in desc["steps"] if s["step"] == "launch_rank")
    ranks = [a["detail"]["rank"] for a in launch["actions"]]
    assert ranks == [1, 0]


def test_load_file_and_env_overrides(tmp_path):
    f = tmp_path / "spark-deploy.toml"
    f.write_text('[serving]\ncontext = 262144\n')
    config = spark_deploy.Config.load(f, env={"PARALLEL": "2", "HF_TOKEN": "hf_pysecret"})
    d = config.to_dict()
    assert d["serving"]["context"] == 262144 and d["serving"]["parallel"] == 2
    assert "hf_pysecret" not in json.dumps(d)
    desc = spark_deploy.Plan.standard(config).describe()
    assert "hf_pysecret" not in json.dumps(desc)
    assert desc["deployment"]["secrets"]["hf_token"] == "***"


@pytest.mark.parametrize(
    "data, field",
    [
        ({"serving": {"context": 1}}, "serving.context"),
        ({"serving": {"parallel": 9}}, "serving.parallel"),
        ({"serving": {"contxt": 1}}, "contxt"),
    ],
)
def test_errors_name_the_field(data, field):
    with pytest.raises(spark_deploy.ConfigError) as info:
        spark_deploy.Config.from_dict(data).validate()
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, spark_deploy.SparkDeployError)


def test_python_and_cli_describe_the_same_plan(tmp_path):
    exe = ROOT / "target" / "debug" / "spark-deploy"
    if not exe.exists():
        pytest.skip("the CLI binary is built by `cargo build` first in .ci/run")
    env = {"HOME": str(pathlib.Path.home()), "PATH": "/usr/bin:/bin"}
    cli = json.loads(subprocess.run([str(exe), "plan", "--json"], cwd=tmp_path, env=env, check=True, capture_output=True).stdout)
    py = spark_deploy.Plan.standard(spark_deploy.Config.load(None, env={})).describe()
    assert cli == py


def test_stub_lists_exactly_the_module_names():
    import types

    public = {n for n in dir(spark_deploy) if not n.startswith("_") and not isinstance(getattr(spark_deploy, n), types.ModuleType)}
    stub = STUB.read_text()
    declared = {line.split()[1].split("(")[0].split(":")[0] for line in stub.splitlines() if line.startswith(("class ", "def "))}
    assert public == declared


def test_four_node_config_plans_every_rank(tmp_path):
    """The four-Spark example, unchanged: validated, planned with all four ranks (followers 3, 2, 1,
    then rank 0), each follower given the base rendezvous port, and the same plan as the CLI's."""
    example = ROOT / "examples" / "four-sparks.toml"
    config = spark_deploy.Config.load(example, env={})
    config.validate()
    desc = spark_deploy.Plan.standard(config).describe()
    assert desc["deployment"]["engine"] == "tensorfold-dsv41-tp4"
    launch = next(s for s in desc["steps"] if s["step"] == "launch_rank")
    specs = [a["detail"] for a in launch["actions"]]
    assert [s["rank"] for s in specs] == [3, 2, 1, 0]
    assert [a["node"] for a in launch["actions"]] == ["spark-4", "spark-3", "spark-2", "head"]
    for s in specs[:3]:
        assert s["argv"][3:7] == [str(s["rank"]), "4", "192.0.2.1", "29620"]
    assert specs[3]["env"]["TF_TP_WORLD"] == "4"
    rank_files = next(s for s in desc["steps"] if s["step"] == "build_rank_cache")
    assert len([a for a in rank_files["actions"] if "weight file" in a["action"]]) == 4
    exe = ROOT / "target" / "debug" / "spark-deploy"
    if exe.exists():
        env = {"HOME": str(pathlib.Path.home()), "PATH": "/usr/bin:/bin"}
        cli = subprocess.run([str(exe), "--config", str(example), "plan", "--json"], cwd=tmp_path, env=env, check=True, capture_output=True)
        assert json.loads(cli.stdout) == desc
