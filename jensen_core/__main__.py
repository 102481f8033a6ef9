"""``python -m jensen_core <command>``: demo (the main job), and the tools next to it."""

from __future__ import annotations

import sys

COMMANDS = {
    "demo": "the Jensen bias and its correction on a video-shaped workload (table + histogram)",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m jensen_core <command> [options]\n\ncommands:")
        for name, text in COMMANDS.items():
            print(f"  {name:<8}{text}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}")
            return 2
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
