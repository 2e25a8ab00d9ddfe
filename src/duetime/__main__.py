"""The `duetime` command's entry point (and `python -m duetime`).

A Ctrl-C while the command's modules load ends with one line and exit code 130, not a
traceback.
"""

import sys


def main() -> int:
    try:
        from duetime.cli import main as run

        return run()
    except KeyboardInterrupt:  # (what the command has not taken over: its imports, its flags)
        sys.stderr.write("duetime: interrupted\n")
        return 130
    except ImportError as exc:  # (ONNX Runtime's own import, interrupted: "initialization
        if not isinstance(exc.__context__, KeyboardInterrupt):  # failed" on the Ctrl-C)
            raise
        sys.stderr.write("duetime: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
