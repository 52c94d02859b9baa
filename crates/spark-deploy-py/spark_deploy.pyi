"""Type stubs for ``spark_deploy``: the spark-deploy plan API from Python."""

import enum
import pathlib
import threading
from collections.abc import Coroutine, Iterable
from os import PathLike
from typing import Any, Callable, Mapping, TypeAlias, final

from typing_extensions import Self

__version__: str

__all__ = [
    "__version__",
    "Config",
    "Plan",
    "Deployment",
    "Testbed",
    "Report",
    "StepStatus",
    "ValidationReport",
    "CheckResult",
    "Verdict",
    "BenchRows",
    "testbed_up",
    "testbed_down",
    "SparkDeployError",
    "ConfigError",
    "UpgradeError",
    "StepError",
    "PreflightError",
    "FetchError",
    "RankCacheError",
    "StorageError",
    "ImageError",
    "LaunchError",
    "SmokeError",
    "StopError",
]

_Event: TypeAlias = dict[str, Any]
"""One event as in ``spark-deploy --json``: ``schema``, ``ts_ms``, ``event`` (``started``,
``progress``, ``log``, ``skipped``, ``finished``, ``failed``), ``step`` and the event's fields."""

class SparkDeployError(Exception):
    """Base class of every spark-deploy error."""

class ConfigError(SparkDeployError):
    """The configuration is unreadable or invalid."""

    field: str | None
    """The first field the error names (``serving.context``), if any."""
    problems: list[tuple[str, str, str]]
    """Every refused field as ``(field, value, allowed)``."""
    remedy: str | None
    """What to do about it."""

class UpgradeError(SparkDeployError):
    """An upgrade or rollback did not end with the new generation serving."""

    remedy: str
    """What to do about it."""
    restored: int | None
    """The generation serving again (rolled back, or never stopped), if any."""

class StepError(SparkDeployError):
    """A step of a plan run failed."""

    step: str
    """The failed step as in events (``preflight``, ``fetch_checkpoint``, ...)."""
    error: str
    """The error chain."""
    remedy: str | None
    """What to do about it."""
    report: Report
    """The steps up to and including the failed one."""
    node: str | None
    """The node the error names, if any."""
    rank: int | None
    """The rank the error names, if any."""
    checks: list[dict[str, Any]]
    """Preflight's table (``check``, ``node``, ``observed``, ``verdict``, ``remedy``); else empty."""

class PreflightError(StepError):
    """A preflight check failed; nothing was changed."""

class FetchError(StepError):
    """Downloading the checkpoint, Engram shards or kit failed (partial files are resumed)."""

class RankCacheError(StepError):
    """Building a rank's cache failed."""

class StorageError(StepError):
    """Giving the workers their bytes (NFS volume or copy) failed."""

class ImageError(StepError):
    """Making the engine image present on every node failed."""

class LaunchError(StepError):
    """Starting a rank failed; every rank of the deployment was stopped."""

class SmokeError(StepError):
    """Readiness or the smoke generation failed; every rank was stopped."""

class StopError(StepError):
    """Stopping a rank failed."""

class StepStatus(str, enum.Enum):
    """What happened to a step in a run; compares equal to its JSON string (``"ran"``)."""

    RAN = "ran"
    SKIPPED = "skipped"
    FAILED = "failed"

class Report(list[dict[str, Any]]):
    """The report of a plan run: one dict per started step (``step``, ``status`` ran/skipped/failed,
    ``duration_ms``, and when known ``detail`` and ``bytes``)."""

    def __init__(self, steps: Iterable[dict[str, Any]] = ...) -> None: ...
    @property
    def ok(self) -> bool:
        """True when no step failed."""
    def _repr_html_(self) -> str: ...

@final
class Config:
    """A deployment configuration (TOML file + environment overrides)."""

    @staticmethod
    def load(path: str | PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
        """Load ``path`` (or the defaults) and apply environment overrides (``env`` or ``os.environ``)."""
    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Config:
        """Build a config from a dict shaped like the TOML file."""
    def validate(self) -> list[dict[str, str]]:
        """Validate every field; return the warnings. Raises ConfigError."""
    def to_dict(self) -> dict[str, Any]:
        """The config as a dict (secrets are never included)."""

@final
class Plan:
    """An ordered list of typed steps for one deployment."""

    @staticmethod
    def standard(config: Config) -> Plan:
        """The standard deployment plan. Raises ConfigError."""
    @staticmethod
    def teardown(config: Config) -> Plan:
        """Stop every rank, rank 0 first, saving logs. Raises ConfigError."""
    @staticmethod
    def from_steps(config: Config, steps: list[str]) -> Plan:
        """A custom plan of the named steps (``"Preflight"``, ``"FetchCheckpoint"``, ...).
        Raises ConfigError, ValueError."""
    def describe(self) -> dict[str, Any]:
        """The plan as plain data (the document ``spark-deploy plan --json`` prints)."""
    def steps(self) -> list[str]:
        """Step kinds in order."""
    def run(self, on_event: Callable[[_Event], object] | None = None, cancel: threading.Event | None = None) -> Report:
        """Run every step with the GIL released; events go to ``on_event`` on the calling thread
        (None: a progress table in Jupyter). Setting ``cancel`` cancels the run. Raises the failed
        step's StepError subclass, or KeyboardInterrupt after a clean cancel."""
    def run_async(self, on_event: Callable[[_Event], object] | None = None) -> Coroutine[Any, Any, Report]:
        """``run()`` for asyncio: events on the loop's thread; cancelling the task cancels the run."""
    def export_lws(
        self,
        *,
        image_content: str | None = None,
        model_commit: str | None = None,
        fabric_addr: dict[str, str] | None = None,
        netdev: dict[str, str] | None = None,
        rdma_devices: dict[str, str] | None = None,
        gid_index: dict[str, str] | None = None,
        verifier: str | None = None,
        rdma_resource: str | None = None,
    ) -> str:
        """The plan as one Kubernetes LeaderWorkerSet (YAML text), as ``spark-deploy export lws``
        writes it. Facts from the last launch; those given here (node -> value) win. Raises
        ValueError for a bad fact, SparkDeployError for a fact still unknown or an unreadable
        image label (``image_content=None`` reads it from the head's Docker)."""
    def _repr_html_(self) -> str: ...

@final
class Deployment:
    """One deployment described by a config."""

    def __new__(cls, config: Config) -> Self: ...
    @property
    def config(self) -> Config:
        """The config this deployment was created from."""
    def plan(self) -> Plan:
        """The standard plan (nothing runs)."""
    def up(self, on_event: Callable[[_Event], object] | None = None) -> Report:
        """Run the standard plan."""
    def preflight(self, on_event: Callable[[_Event], object] | None = None) -> Report:
        """Check every node; changes nothing. Raises PreflightError."""
    def api_key(self) -> str:
        """The deployment's API key (generated by the first ``up()``). Raises SparkDeployError."""
    @property
    def base_url(self) -> str:
        """The API's base URL on the head, e.g. ``http://127.0.0.1:8888/v1``."""
    def status(self) -> dict[str, Any]:
        """The deployment's state: ``overall``, ``served``, ``served_error`` and ``ranks`` (one dict per
        rank: ``rank``, ``node``, ``container``, ``state``, ``started_at``, ``fingerprint``,
        ``mem_available_gib``), ``watch`` (the supervisor's state, stop marker, pause lease)."""
    def logs(self, rank: int = 0, tail: int | None = 200) -> str:
        """The engine log of one rank's container ("" when it does not exist)."""
    def support_bundle(self, out: str | PathLike[str] | None = None) -> str:
        """Write a support bundle (one ``.tar.gz``, secrets scrubbed) and return its path; default
        ``<state_dir>/bundles/<name>-<time>.tar.gz``. Raises SparkDeployError."""
    def stop(self, on_event: Callable[[_Event], object] | None = None) -> Report:
        """Stop every rank, rank 0 first, saving logs. Raises StopError."""
    def restart(self, on_event: Callable[[_Event], object] | None = None) -> Report:
        """Stop both ranks and start both again in one run (Stop + the standard plan)."""
    def upgrade(
        self,
        new_config: Config,
        on_event: Callable[[_Event], object] | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any]:
        """Prepare ``new_config`` beside the serving generation, switch, check (smoke, validate, a
        short bench within 5 %) and keep it, or start the old generation again. Returns
        ``generation``, ``previous``, ``figures``, ``baseline``, ``switch_s``, ``removed``.
        Raises ConfigError, UpgradeError (``.remedy``, ``.restored``), KeyboardInterrupt."""
    def rollback(self, on_event: Callable[[_Event], object] | None = None) -> int:
        """Stop the serving generation and start the one that served before it; returns the
        generation serving now. Raises UpgradeError."""
    def history(self) -> list[dict[str, Any]]:
        """Every generation, oldest first (``id``, ``state``, ``fingerprint``, ``served_from``,
        ``served_until``, ``figures``, ``note``, ...). Raises SparkDeployError."""
    def watch(
        self,
        on_event: Callable[[_Event], object] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        """Supervise the running pair until cancelled (``cancel`` set, or Ctrl-C, which raises
        KeyboardInterrupt): samples, decisions and heals of both ranks or neither, as events."""
    def validate(
        self,
        only: list[str] = ...,
        skip: list[str] = ...,
        needle: int | None = None,
        on_event: Callable[[_Event], object] | None = None,
    ) -> ValidationReport:
        """The checks of ``spark-deploy validate`` through the API. Raises ValueError (unknown
        check, needle too large for the pool), SparkDeployError (no API key file)."""
    def bench(
        self,
        streams: list[int] = ...,
        kinds: list[str] = ...,
        max_tokens: int = 256,
        reps: int = 3,
        prefill: list[int] = ...,
        on_event: Callable[[_Event], object] | None = None,
        cancel: threading.Event | None = None,
    ) -> BenchRows:
        """Decode and prefill rates by the recipe's method, stored under the state directory by
        fingerprint. Ctrl-C or ``cancel`` stops the load and returns the rows measured so far."""

class Verdict(str, enum.Enum):
    """A validation check's outcome; equal to its JSON string."""

    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"

class CheckResult:
    """One check of ``Deployment.validate()``."""

    check: str
    verdict: Verdict
    detail: str
    seconds: float
    def __init__(self, check: str, verdict: str, detail: str, seconds: float) -> None: ...

class ValidationReport(list[CheckResult]):
    """The results of ``Deployment.validate()``, in order."""

    base_url: str
    model: str
    def __init__(self, results: list[CheckResult], base_url: str = "", model: str = "") -> None: ...
    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ValidationReport: ...
    @property
    def ok(self) -> bool:
        """No check failed (``unsupported`` is not a failure)."""
    @property
    def failed(self) -> list[str]:
        """Names of the failed checks."""
    def _repr_html_(self) -> str: ...

class BenchRows(list[dict[str, Any]]):
    """The rows of ``Deployment.bench()`` (medians), shown as the chart in Jupyter."""

    json: dict[str, Any]
    table: str
    html: str
    png: bytes
    path: str
    interrupted: bool
    def __init__(
        self,
        rows: list[dict[str, Any]],
        json: dict[str, Any],
        table: str,
        html: str,
        png: bytes,
        path: str,
        interrupted: bool = False,
    ) -> None: ...
    @classmethod
    def from_json(
        cls, doc: dict[str, Any], table: str, html: str, png: bytes, path: str, interrupted: bool = False
    ) -> BenchRows: ...
    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame`` (needs pandas)."""
    def _repr_html_(self) -> str: ...
    def _repr_png_(self) -> bytes: ...

# Testbed, testbed_up and testbed_down exist in builds with the cargo feature `testbed` (the
# default); a module built with --no-default-features has neither.

@final
class Testbed:
    """A running testbed with its hub and the config that deploys onto it."""

    @property
    def config(self) -> Config:
        """The deployment config targeting this testbed."""
    @property
    def state_dir(self) -> pathlib.Path:
        """The testbed's state directory."""
    def close(self) -> None:
        """Stop the hub (the containers stay; ``testbed_down()`` removes them)."""

def testbed_up(workers: int = 1) -> Testbed:
    """Bring the testbed up (``workers=3``: four nodes, the TP=4 profile), start its hub over the
    test-scale checkpoint, install the stand-in."""

def testbed_down() -> bool:
    """Remove everything the testbed created; True when its state directory existed."""
