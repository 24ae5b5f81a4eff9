"""The exit codes of `python -m trioworker` (its module docstring says what each means)."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
#: `wait`: the item had not ended within --timeout (as timeout(1) exits).
EXIT_TIMEOUT = 124
EXIT_FAIL_STOP = 70
EXIT_TAKEN_OVER = 75
EXIT_INTERRUPTED = 130
