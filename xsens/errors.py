"""Errors that xsens raises for bad user input."""


class ConfigError(ValueError):
  """A config field holds a value xsens cannot use.

  The message always names the field (e.g. ``model.patch_size``) and what is allowed,
  so the CLI can print it as one line and exit with code 2 before anything compiles.
  """

  def __init__(self, field: str, message: str):
    self.field = field
    self.message = message
    super().__init__(f"config.{field}: {message}")
