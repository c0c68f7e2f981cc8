"""`turnip-opt`: the compiler driver (turnip_cli/opt_driver.py).

`turnip-opt FILE [-p PIPELINE] [--emit mlir|json|dot] [-o OUT] [--stats]`. This module is the entry
point and imports only the standard library and `interrupt` at the top: xDSL and the passes take a
second to import, and a Ctrl-C in that second must end in "interrupted" and exit 130, not a traceback.
So the guard goes in first and the driver is imported under it.
"""

from __future__ import annotations

import sys

from turnip_cli import interrupt


def main(argv: list[str] | None = None) -> int:
    try:
        with interrupt.guard():
            from turnip_cli import opt_driver
        return opt_driver.main(argv)  # it guards its own run
    except KeyboardInterrupt:
        print("turnip-opt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
