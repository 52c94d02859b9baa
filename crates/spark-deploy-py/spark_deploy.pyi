"""Type stubs for ``spark_deploy``: the spark-deploy plan API from Python."""

from os import PathLike
from typing import Any, Mapping

__version__: str

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

class Plan:
    """An ordered list of typed steps for one deployment."""

    @staticmethod
    def standard(config: Config) -> Plan:
        """The standard deployment plan. Raises ConfigError."""
    def describe(self) -> dict[str, Any]:
        """The plan as plain data (the document ``spark-deploy plan --json`` prints)."""
    def steps(self) -> list[str]:
        """Step kinds in order."""
