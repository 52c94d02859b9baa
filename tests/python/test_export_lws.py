"""`spark-deploy export lws|compose` read back by independent tools: PyYAML loads the files and
jsonschema checks the LeaderWorkerSet against the CRD's facts written down below from the
LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1). No Kubernetes API server runs here: this is
what can be checked without one."""

import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import jsonschema
import pytest
import yaml

from conftest import spark_deploy_binary

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONTENT = "c" * 64
SECRET = "sk-export-test-not-in-any-manifest"
FACTS = [
    "--model-commit", COMMIT,
    "--fabric-addr", "head=192.168.100.1", "--fabric-addr", "worker-1=192.168.100.2",
    "--netdev", "head=enp1s0f1np1", "--netdev", "worker-1=enp1s0f1np1",
    "--rdma-devices", "head=rocep1s0f1", "--rdma-devices", "worker-1=rocep1s0f1",
    "--gid-index", "head=3", "--gid-index", "worker-1=3",
]

# The LeaderWorkerSet CRD's facts (API leaderworkerset.x-k8s.io/v1): apiVersion and kind,
# spec.leaderWorkerTemplate required and within it workerTemplate; size an integer, at least 1
# (the leader); restartPolicy one of Default (deprecated), RecreateGroupOnPodRestart, None;
# startupPolicy one of LeaderCreated, LeaderReady; replicas a non-negative integer. Pod templates
# follow core/v1: containers required and non-empty, each container and volume named.
# Unknown fields are refused here (a structural CRD would silently prune them).
NAMED = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}}
POD_TEMPLATE = {
    "type": "object",
    "properties": {
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["containers"],
            "properties": {
                "containers": {"type": "array", "minItems": 1, "items": NAMED},
                "initContainers": {"type": "array", "items": NAMED},
                "volumes": {"type": "array", "items": NAMED},
                "hostNetwork": {"type": "boolean"},
            },
        },
    },
}
LWS_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["leaderWorkerTemplate"],
            "additionalProperties": False,
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "rolloutStrategy": {"type": "object"},
                "networkConfig": {"type": "object"},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "required": ["workerTemplate"],
                    "additionalProperties": False,
                    "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart", "None"]},
                        "leaderTemplate": POD_TEMPLATE,
                        "workerTemplate": POD_TEMPLATE,
                        "subGroupPolicy": {"type": "object"},
                        "volumeClaimTemplates": {"type": "array"},
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def cli() -> pathlib.Path:
    return spark_deploy_binary()


@pytest.fixture()
def config(tmp_path: pathlib.Path) -> pathlib.Path:
    key = tmp_path / "api-key"
    key.write_text(SECRET)
    key.chmod(0o600)
    f = tmp_path / "spark-deploy.toml"
    f.write_text(f'[deployment]\nstate_dir = "{tmp_path / "state"}"\n[serving]\napi_key_file = "{key}"\n')
    return f


def export(cli, config, *args, check=True):
    # No environment overrides (PORT, WORKER, ...): the file alone, as Config.load(env={}) reads it.
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    return subprocess.run(
        [str(cli), "--config", str(config), "export", *args],
        capture_output=True, text=True, check=check, env=env,
    )


def lws_document(cli, config, tmp_path) -> tuple[str, dict]:
    out = tmp_path / "lws.yaml"
    export(cli, config, "lws", "--image-content", CONTENT, "--out", str(out), *FACTS)
    text = out.read_text()
    return text, yaml.safe_load(text)


def test_the_lws_matches_the_crd_schema_and_yaml_1_1(cli, config, tmp_path):
    text, doc = lws_document(cli, config, tmp_path)
    jsonschema.validate(doc, LWS_SCHEMA)
    spec = doc["spec"]
    t = spec["leaderWorkerTemplate"]
    assert (t["size"], t["restartPolicy"], spec["startupPolicy"]) == (2, "RecreateGroupOnPodRestart", "LeaderCreated")
    # The schema refuses what the types refuse.
    for path, bad in [(("size",), 0), (("restartPolicy",), "Always"), (("startupPolicy",), "LeaderLater")]:
        broken = yaml.safe_load(text)
        target = broken["spec"] if path[0] == "startupPolicy" else broken["spec"]["leaderWorkerTemplate"]
        target[path[0]] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, LWS_SCHEMA)
    assert "LeaderReady would deadlock" in text


def test_the_pods_carry_what_the_ranks_need_and_no_secret(cli, config, tmp_path):
    text, doc = lws_document(cli, config, tmp_path)
    assert SECRET not in text
    t = doc["spec"]["leaderWorkerTemplate"]
    leader, worker = t["leaderTemplate"], t["workerTemplate"]
    for pod in (leader, worker):
        s = pod["spec"]
        assert s["hostNetwork"] is True and s["hostIPC"] is True
        c = s["containers"][0]
        assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
        assert c["resources"]["requests"]["memory"].endswith("Mi")
        assert pod["metadata"]["annotations"]["spark-deploy.io/image-content"] == CONTENT
        init = s["initContainers"][0]["command"]
        assert init[1:3] == ["rank-cache", "verify"]
        assert all(v.get("hostPath") or v.get("nfs") or v.get("secret") for v in s["volumes"])
    wc = worker["spec"]["containers"][0]
    assert "$(LWS_WORKER_INDEX)" in wc["command"]
    assert "readinessProbe" not in wc and "livenessProbe" not in wc
    probe = " ".join(leader["spec"]["containers"][0]["readinessProbe"]["exec"]["command"])
    assert "/v1/chat/completions" in probe and "/health" not in probe
    key_volume = next(v for v in leader["spec"]["volumes"] if "secret" in v)
    assert key_volume["secret"]["secretName"] == "dsv41-api-key"
    env = {e["name"]: e["value"] for e in leader["spec"]["containers"][0]["env"]}
    assert env["TF_TP_MASTER"] == "192.168.100.1" and env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"


def test_facts_come_from_the_last_launch_and_flags_win(cli, config, tmp_path):
    state = tmp_path / "state"
    state.mkdir()

    def node(name: str, addr: str) -> dict:
        return {
            "node": name, "fabric_addr": addr, "netdev": "enp1s0f1np1", "rdma_devices": "rocep1s0f1",
            "gid_index": "3", "infiniband_device": "/dev/infiniband", "gpu": True,
        }

    record = {
        "config_sha256": "0" * 64, "fingerprint": "f" * 64, "model_commit": COMMIT,
        "nodes": [node("head", "192.168.100.1"), node("worker-1", "192.168.100.2")],
        "ranks": [], "at_unix": 1796000000,
    }
    (state / "launched.json").write_text(json.dumps(record))
    doc = yaml.safe_load(export(cli, config, "lws", "--image-content", CONTENT).stdout)
    t = doc["spec"]["leaderWorkerTemplate"]
    env = {e["name"]: e["value"] for e in t["leaderTemplate"]["spec"]["containers"][0]["env"]}
    assert env["TF_TP_MASTER"] == "192.168.100.1" and env["NCCL_IB_HCA"] == "rocep1s0f1"
    assert COMMIT in " ".join(t["workerTemplate"]["spec"]["containers"][0]["command"])
    doc = yaml.safe_load(export(cli, config, "lws", "--image-content", CONTENT, "--fabric-addr", "head=198.18.0.9").stdout)
    env = {e["name"]: e["value"] for e in doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["env"]}
    assert env["TF_TP_MASTER"] == "198.18.0.9"


def test_unknown_facts_refuse_naming_node_and_flag(cli, config):
    r = export(cli, config, "lws", "--image-content", CONTENT, check=False)
    assert r.returncode == 5, r.stderr
    assert "worker-1: its fabric IPv4 address" in r.stderr
    assert "--fabric-addr worker-1=<IPv4>" in r.stderr
    r = export(cli, config, "lws", "--fabric-addr", "spark-9=1.2.3.4", check=False)
    assert r.returncode == 2 and "spark-9" in r.stderr


def test_compose_files_per_node_are_plain_yaml_and_not_group_safe(cli, config, tmp_path):
    out = tmp_path / "compose"
    out.mkdir()
    export(cli, config, "compose", "--out", str(out), *FACTS)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["head.compose.yaml", "worker-1.compose.yaml"]
    for name, rank in [("head.compose.yaml", 0), ("worker-1.compose.yaml", 1)]:
        text = (out / name).read_text()
        assert text.startswith("# NOT GROUP-SAFE.")
        svc = yaml.safe_load(text)["services"][f"rank{rank}"]
        assert svc["restart"] == "no"  # a string, also for YAML 1.1 readers
        assert svc["network_mode"] == "host" and svc["entrypoint"] == []
        assert svc["ulimits"]["memlock"] == {"soft": -1, "hard": -1}
    # Without --out: both files on standard output, one YAML document each.
    docs = list(yaml.safe_load_all(export(cli, config, "compose", *FACTS).stdout))
    assert [sorted(d["services"]) for d in docs] == [["rank1"], ["rank0"]]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
def test_docker_compose_accepts_the_files_and_reads_the_exact_argv(cli, config, tmp_path):
    out = tmp_path / "compose"
    out.mkdir()
    export(cli, config, "compose", "--out", str(out), *FACTS)
    for name in ("head.compose.yaml", "worker-1.compose.yaml"):
        mine = yaml.safe_load((out / name).read_text())
        r = subprocess.run(["docker-compose", "-f", str(out / name), "config"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        seen = yaml.safe_load(r.stdout)["services"]
        for svc, want in mine["services"].items():
            assert seen[svc]["command"] == want["command"]
            assert seen[svc]["environment"] == want["environment"]
            assert seen[svc]["network_mode"] == "host"


def test_lws_on_standard_output_is_the_file(cli, config, tmp_path):
    text, _ = lws_document(cli, config, tmp_path)
    assert export(cli, config, "lws", "--image-content", CONTENT, *FACTS).stdout == text


def test_python_export_lws_is_the_cli_export(cli, config, tmp_path):
    import spark_deploy

    text, _ = lws_document(cli, config, tmp_path)
    cfg = spark_deploy.Config.load(str(config), env={})
    nodes = ["head", "worker-1"]
    py = spark_deploy.Plan.standard(cfg).export_lws(
        image_content=CONTENT,
        model_commit=COMMIT,
        fabric_addr={"head": "192.168.100.1", "worker-1": "192.168.100.2"},
        netdev={n: "enp1s0f1np1" for n in nodes},
        rdma_devices={n: "rocep1s0f1" for n in nodes},
        gid_index={n: "3" for n in nodes},
    )
    assert py == text
    with pytest.raises(ValueError, match="spark-9"):
        spark_deploy.Plan.standard(cfg).export_lws(image_content=CONTENT, netdev={"spark-9": "eth0"})
    with pytest.raises(spark_deploy.SparkDeployError, match="fabric IPv4"):
        spark_deploy.Plan.standard(cfg).export_lws(image_content=CONTENT)


def k8s_expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of container commands: `$(NAME)` when defined, `$$` -> `$`."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "$" and i + 1 < len(s):
            if s[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if s[i + 1] == "(" and ")" in s[i + 2:]:
                end = s.index(")", i + 2)
                name = s[i + 2:end]
                out.append(env.get(name, s[i:end + 1]))
                i = end + 1
                continue
        out.append(s[i])
        i += 1
    return "".join(out)


def host_command(pod: dict, container: dict, index: int, verifier: pathlib.Path) -> list[str]:
    """The container's command as it would run on its node: the index substituted, every
    container path under a hostPath mount mapped to the host path, the verifier the real binary."""
    host = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    mounts = sorted(
        ((m["mountPath"], host[m["name"]]) for m in container["volumeMounts"] if m["name"] in host),
        key=lambda m: -len(m[0]),
    )
    out = []
    for arg in container["command"]:
        arg = k8s_expand(arg, {"LWS_WORKER_INDEX": str(index)})
        for inside, outside in mounts:
            if arg == inside or arg.startswith(inside + "/"):
                arg = outside + arg[len(inside):]
                break
        out.append(arg)
    assert out[0] == "/usr/local/bin/spark-deploy" or out[0].endswith("/spark-deploy"), out
    return [str(verifier), *out[1:]]


def test_the_init_container_verifies_real_staged_inputs(cli, tmp_path):
    """The worker's init command, run on its node's files: a test-scale checkpoint in the HF cache
    and rank 1's file built by spark-deploy. It passes for index 1 and refuses index 0, whose
    file is not on this node (a worker on the wrong Spark never starts)."""
    from conftest import generate_hub_tree

    gen = tmp_path / "gen"
    generate_hub_tree(gen)
    snapshot = tmp_path / "hf" / "hub" / "models--testbed--dsv41-exl3" / "snapshots" / COMMIT
    snapshot.parent.mkdir(parents=True)
    shutil.copytree(gen / "testbed" / "dsv41-exl3", snapshot)
    cfg = tmp_path / "spark-deploy.toml"
    cfg.write_text(
        f'[deployment]\nstate_dir = "{tmp_path / "state"}"\nworker_storage = "copy"\n'
        f'[model]\nid = "testbed/dsv41-exl3"\nrevision = "{COMMIT}"\n'
        f'[hub]\ncache = "{tmp_path / "hf"}"\n[engine]\nshape_guard = false\n'
        f'[[nodes]]\nname = "head"\nssh = "local"\ndata_dir = "{tmp_path / "head"}"\n'
        f'[[nodes]]\nname = "worker-1"\nssh = "u@spark-2"\ndata_dir = "{tmp_path / "worker"}"\n'
    )
    doc = yaml.safe_load(export(cli, cfg, "lws", "--image-content", CONTENT, *FACTS[2:]).stdout)
    worker = doc["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    init = worker["spec"]["initContainers"][0]
    assert "--test-scale" in init["command"]
    cache = next(v["hostPath"]["path"] for v in worker["spec"]["volumes"] if v["name"] == "cache")
    assert cache.startswith(str(tmp_path / "worker"))
    subprocess.run(
        [str(cli), "rank-cache", "build", str(snapshot), f"{cache}/rank-cache", "1", "2", "--test-scale"],
        check=True, capture_output=True,
    )
    ok = subprocess.run(host_command(worker, init, 1, cli), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout
    wrong = subprocess.run(host_command(worker, init, 0, cli), capture_output=True, text=True)
    assert wrong.returncode != 0 and "rank0of2" in wrong.stderr, wrong.stderr


def test_the_stack_limit_shell_execs_the_exact_argv(cli, config, tmp_path):
    """The rank's command as the kubelet runs it: the shell raises the stack limit, then execs
    the argv unchanged (here a Python that reports its argv and limit instead of the engine)."""
    _, doc = lws_document(cli, config, tmp_path)
    cmd = [k8s_expand(a, {}) for a in doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"]]
    assert cmd[:2] == ["/bin/sh", "-c"]
    engine_argv = cmd[3:]
    report = "import json, resource, sys; print(json.dumps([sys.argv[1:], resource.getrlimit(resource.RLIMIT_STACK)[0]]))"
    tricky = ["a b", "$HOME", "$(X)", "'q'", '"d"']
    r = subprocess.run([*cmd[:3], sys.executable, "-c", report, *engine_argv, *tricky], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    argv, stack = json.loads(r.stdout)
    assert argv == engine_argv + tricky
    assert stack == 64 << 20


class _Api(http.server.BaseHTTPRequestHandler):
    seen: list = []
    status = 200

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Api.seen.append((self.path, self.headers.get("Authorization"), body))
        reply = json.dumps({"choices": [{"message": {"content": "OK"}}]}).encode()
        self.send_response(_Api.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readiness_probe_generates_one_token_with_the_key_from_its_file(cli, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = tmp_path / "api-key"
        key.write_text(SECRET)
        cfg = tmp_path / "spark-deploy.toml"
        cfg.write_text(f'[deployment]\nstate_dir = "{tmp_path}"\n[serving]\napi_key_file = "{key}"\nport = {server.server_port}\n')
        _, doc = lws_document(cli, cfg, tmp_path)
        leader = doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
        probe = leader["readinessProbe"]["exec"]["command"]
        mount = next(m["mountPath"] for m in leader["volumeMounts"] if m.get("subPath") == "api-key")
        assert SECRET not in " ".join(probe)
        # The probe as the kubelet runs it, with the Secret's file at a path of this machine.
        script = [*probe[:2], probe[2].replace(mount, str(key))]
        assert subprocess.run(script, capture_output=True, timeout=60).returncode == 0
        path, auth, body = _Api.seen[-1]
        assert path == "/v1/chat/completions" and auth == f"Bearer {SECRET}"
        assert body["max_tokens"] == 1 and body["model"] == "DeepSeek-V4.1-Flash-1017"
        _Api.status = 503  # rank 0 up but the group not serving: not ready
        assert subprocess.run(script, capture_output=True, timeout=60).returncode != 0
    finally:
        _Api.status = 200
        server.shutdown()
