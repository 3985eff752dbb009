"""The one error type that the command line turns into a clear message and exit code 2."""


class PlanError(ValueError):
    """Bad input or an impossible request; `str(err)` is the message shown to the user.

    `field` names the offending field (dotted path) when there is one.
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)
