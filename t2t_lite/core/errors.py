"""Errors the command-line programs turn into one-line messages and exit codes.

UsageError: the user asked for something that cannot work (bad flag, unknown name, bad
data layout); exit code 2. RunError: a run failed while doing what was asked (too many
non-finite updates, unreadable checkpoint); exit code 1.
"""


class UsageError(Exception):
  """Bad input from the user; the message says what is wrong and how to fix it."""

  exit_code = 2


class RunError(Exception):
  """A failure during a run that the user did not cause by a bad flag."""

  exit_code = 1
