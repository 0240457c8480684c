"""operations.sglang against pyinfra-testing fixtures (tests/specs/op_sglang/<op>/*.yaml): the
op's branches, commands and present-tense no-op messages, from given fact values, in ms."""

from pathlib import Path

import pytest
from pyinfra_testing.operations import make_operation_tests

SPECS = Path(__file__).parents[1] / "specs" / "op_sglang"

TestInstalled = make_operation_tests("operations", "sglang.installed", SPECS / "sglang.installed")
TestCompressedTensors = make_operation_tests(
    "operations", "sglang.compressed_tensors", SPECS / "sglang.compressed_tensors"
)
TestPr20547 = make_operation_tests("operations", "sglang.pr20547", SPECS / "sglang.pr20547")
TestDflashRope = make_operation_tests("operations", "sglang.dflash_rope",
                                      SPECS / "sglang.dflash_rope")  # fmt: skip
# These cases read the 0.5.11 wheel of the fleet's wheelhouse (the patch's recipe compares the
# venv's file with the wheel's own): local, out of the fast lane.
TestDflashRopeWheel = pytest.mark.local(make_operation_tests(
    "operations", "sglang.dflash_rope", SPECS / "sglang.dflash_rope.wheel"))  # fmt: skip
