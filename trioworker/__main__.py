import sys

from trioworker._cli.main import main

if __name__ == "__main__":
    sys.exit(main())
