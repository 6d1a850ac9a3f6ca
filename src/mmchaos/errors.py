"""The one exception root of mmchaos.

Every error a user can meet carries a stable ``code`` (a short snake_case string that scripts and
HTTP layers can switch on) and a one-line message. The CLI maps :class:`UsageError` and its
children to exit code 2; anything else escaping a check becomes an ``error`` finding instead.

Every code mmchaos raises is an entry of :data:`mmchaos.error_codes.CODES` (its one HTTP status and
meaning), which :attr:`MMChaosError.http_status` reads. Codes are checked against the table by
``tests/unit/runs/test_error_codes.py`` (a scan of the sources), not at construction: a third-party plugin's
own code, or a remote endpoint's passed through, must never crash a run; such a code answers with
the status of the nearest class whose default code is in the table.

::

    MMChaosError
    ├── UsageError (ValueError)          bad input to mmchaos itself -> exit 2
    │   ├── ConfigError                  suite files, check parameters, CLI options
    │   ├── UnknownNameError             a registry name that does not exist
    │   ├── DataError                    missing files, unreadable images, bad rows
    │   ├── TargetLoadError              a target URI that cannot be loaded
    │   ├── MissingDependencyError       an optional extra is not installed
    │   └── StoreError                   the run store cannot be opened or lacks a run
    ├── CapabilityError                  a check asked a target for something it cannot do
    ├── TargetCallError                  the target raised or returned garbage during a call
    ├── PreflightError                   an input broke the serving contract (http_status)
    │   ├── MalformedInputError          400: corrupt, truncated, invalid UTF-8, empty
    │   ├── InputTooLargeError           413: bytes, pixels, element count, bomb, text, tokens
    │   ├── UnsupportedInputError        415: a format or mode the contract does not accept
    │   └── UnprocessableInputError      422: too small, aspect ratio, animated, NaN
    ├── CallNotPermitted                 the circuit breaker is open (503, retry_after)
    └── CompatibilityError               model components that do not belong together

The guard errors live in :mod:`mmchaos.guard` (imported lazily: serving code pays only for
what it uses).
"""

from __future__ import annotations

from mmchaos.error_codes import CODES

__all__ = [
    "CapabilityError",
    "ConfigError",
    "DataError",
    "MMChaosError",
    "MissingDependencyError",
    "StoreError",
    "TargetCallError",
    "TargetLoadError",
    "UnknownNameError",
    "UsageError",
]


class MMChaosError(Exception):
    """Root of every mmchaos error; ``code`` is stable across releases."""

    code: str = "mmchaos_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code

    @property
    def http_status(self) -> int:
        """The status a server answers this error with: its code's, from the table; for a code the
        table lacks (a plugin's), that of the nearest class whose own default code it has."""
        entry = CODES.get(self.code)
        if entry is not None:
            return entry.status
        for cls in type(self).__mro__:
            default = CODES.get(cls.__dict__.get("code", ""))
            if default is not None:
                return default.status
        return 500


class UsageError(MMChaosError, ValueError):
    """Bad input to mmchaos itself: the CLI exits with code 2."""

    code = "usage_error"


class ConfigError(UsageError):
    code = "config_invalid"


class UnknownNameError(UsageError):
    code = "unknown_name"


class DataError(UsageError):
    code = "data_invalid"


class TargetLoadError(UsageError):
    code = "target_load_failed"


class MissingDependencyError(UsageError, ImportError):
    code = "missing_dependency"


class StoreError(UsageError):
    code = "store_error"


class CapabilityError(MMChaosError):
    code = "capability_missing"


class TargetCallError(MMChaosError):
    code = "target_call_failed"
