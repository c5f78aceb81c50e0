"""Runs a command with the zig settings maturin gave cargo when it built the CI wheel.

Usage: python .ci/with_zig_env.py RECORD -- COMMAND [ARG ...]

RECORD is the environment .ci/record-cargo-env wrote during `maturin build --zig`. Its zig
part (the target's C compiler, archiver and linker wrappers, cargo-zigbuild's settings and
the flags that keep them off host builds) is added to this process's environment, so a
following `cargo test` with the same profile and target sees the configuration the wheel
was built with and reuses its compiled dependencies.
"""

from __future__ import annotations

import os
import re
import sys

ZIG = re.compile(
    r"^((AR|CC|CXX|RANLIB|BINDGEN_EXTRA_CLANG_ARGS|CMAKE_TOOLCHAIN_FILE)_\w+"
    r"|CARGO_TARGET_\w+_LINKER|CARGO_TARGET_APPLIES_TO_HOST|CARGO_UNSTABLE_TARGET_APPLIES_TO_HOST"
    r"|CARGO_ZIGBUILD_\w+|ZIG_COMMAND|__CARGO_TEST_CHANNEL_OVERRIDE_DO_NOT_USE_THIS)$"
)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    env = dict(os.environ)
    with open(argv[0], encoding="utf-8") as record:
        for line in record:
            name, sep, value = line.rstrip("\n").partition("=")
            if sep and ZIG.match(name):
                env[name] = value
    os.execvpe(argv[2], argv[2:], env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
